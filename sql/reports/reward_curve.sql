-- Learning curve: mean root reward and success per round, trained share of nodes.
SELECT s.round, count(DISTINCT s.tree_id) AS trees,
       round(avg(s.reward) FILTER (WHERE s.parent_id IS NULL), 3) AS mean_root_reward,
       round(avg(s.success) FILTER (WHERE s.parent_id IS NULL), 3) AS root_success,
       round(avg(CASE WHEN s.trained THEN 1 ELSE 0 END), 3) AS trained_share
FROM scores s
GROUP BY s.round
ORDER BY s.round;
