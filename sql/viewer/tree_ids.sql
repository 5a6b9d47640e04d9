-- The tree ids of one round, sorted: the population the viewer's sample of pages is drawn from.
SELECT DISTINCT tree_id FROM nodes WHERE round = $round ORDER BY tree_id;
