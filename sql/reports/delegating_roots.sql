-- Per round: roots that delegate against roots that work inline. Their success, and the summed
-- advantage and count of non-zero advantages they carry: the signal that teaches delegation.
SELECT n.round, n.children > 0 AS delegates, count(*) AS roots, round(avg(n.success), 3) AS success,
       round(sum(s.advantage), 1) AS advantage_sum,
       count(*) FILTER (WHERE s.advantage <> 0) AS nonzero_advantages
FROM nodes n LEFT JOIN scores s USING (round, node_id)
WHERE n.parent_id IS NULL
GROUP BY n.round, delegates
ORDER BY n.round, delegates;
