-- Trees left out of training per round, by reason (timeout, unfinished_root, single_tree_group,
-- zero_advantage_group), with the share of the round's trees.
SELECT round, coalesce(drop_reason, 'trained') AS outcome, count(DISTINCT tree_id) AS trees,
       round(count(DISTINCT tree_id) / sum(count(DISTINCT tree_id)) OVER (PARTITION BY round), 3) AS share
FROM scores
GROUP BY round, outcome
ORDER BY round, outcome;
