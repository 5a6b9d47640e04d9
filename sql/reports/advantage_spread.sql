-- Advantage spread per group (root task): a group with no spread teaches nothing.
SELECT round, task_id, count(DISTINCT tree_id) AS trees,
       count(*) FILTER (WHERE trained) AS trained_nodes,
       round(min(advantage), 3) AS min_adv, round(max(advantage), 3) AS max_adv,
       round(stddev_pop(advantage), 3) AS sd_adv,
       round(sum(advantage) FILTER (WHERE parent_id IS NULL AND baseline IS NOT NULL), 9) AS root_adv_sum
FROM scores
GROUP BY round, task_id
ORDER BY round, sd_adv DESC NULLS LAST;
