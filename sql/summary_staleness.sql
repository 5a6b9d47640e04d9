-- The staleness histogram of one scored round (rao_core.scoring.scores_summary): nodes and trained
-- nodes per staleness (the version the round trains minus the version that sampled the node).
SELECT staleness, count(*) AS nodes, count(*) FILTER (WHERE trained) AS trained_nodes
FROM scores
GROUP BY staleness
ORDER BY staleness;
