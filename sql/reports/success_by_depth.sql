-- Mean success and node count per round and depth (does the policy solve its own sub-tasks?).
SELECT round, depth, count(*) AS nodes, round(avg(success), 3) AS mean_success,
       round(avg(CASE WHEN status = 'finished' THEN 1 ELSE 0 END), 3) AS finished_rate
FROM nodes
GROUP BY round, depth
ORDER BY round, depth;
