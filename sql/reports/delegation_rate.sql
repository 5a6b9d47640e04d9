-- Delegation rate: share of nodes that started at least one sub-agent, per round and depth.
SELECT round, depth, count(*) AS nodes,
       round(avg(CASE WHEN children > 0 THEN 1 ELSE 0 END), 3) AS delegation_rate,
       round(avg(children), 2) AS mean_children
FROM nodes
GROUP BY round, depth
ORDER BY round, depth;
