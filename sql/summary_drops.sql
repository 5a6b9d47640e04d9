-- Dropped trees by reason in one scored round (rao_core.scoring.scores_summary).
SELECT drop_reason, count(DISTINCT tree_id) AS trees
FROM scores
WHERE drop_reason IS NOT NULL
GROUP BY drop_reason
ORDER BY drop_reason;
