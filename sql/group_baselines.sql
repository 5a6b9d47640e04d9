-- Eq. 3 of RAO, one row per tree: the leave-one-out baseline and whether the tree is trained.
--   b_{-g} = (sum of the OTHER valid trees' root rewards in the task's group) / (number of them)
-- A group is a root task (task_id) within the round. Which trees are valid, and what happens to
-- groups the equation cannot serve, are settings (docs/scoring.md):
--   * tree_status = 'timeout'                -> always dropped from its group ('timeout')
--   * root status != 'finished'              -> $unfinished_roots: 'keep' | 'drop' ('unfinished_root')
--   * one valid tree in the group            -> $single_tree_groups: 'skip' ('single_tree_group')
--                                               | 'zero_baseline' (b = 0, A = R)
--   * every node advantage of the group is 0 -> $zero_advantage_groups: 'skip' ('zero_advantage_group')
--                                               | 'keep'
-- drop_reason IS NULL means the tree's nodes are trained. Reads the temp table node_rewards.
CREATE OR REPLACE TEMP TABLE tree_baselines AS
WITH trees AS (
    SELECT tree_id,
           any_value(task_id) AS task_id,
           coalesce(bool_or(tree_status = 'timeout'), false) AS timed_out,
           any_value(reward) FILTER (WHERE parent_id IS NULL) AS root_reward,
           any_value(status) FILTER (WHERE parent_id IS NULL) AS root_status
    FROM node_rewards
    GROUP BY tree_id
),
validity AS (
    SELECT *,
           CASE WHEN timed_out THEN 'timeout'
                WHEN $unfinished_roots = 'drop' AND root_status IS DISTINCT FROM 'finished'
                    THEN 'unfinished_root'
           END AS invalid_reason
    FROM trees
),
-- Group totals over valid trees only; each tree then subtracts itself (leave-one-out).
groups AS (
    SELECT *,
           count(*) FILTER (WHERE invalid_reason IS NULL) OVER (PARTITION BY task_id) AS n_valid,
           sum(root_reward) FILTER (WHERE invalid_reason IS NULL) OVER (PARTITION BY task_id) AS valid_sum
    FROM validity
),
baselines AS (
    SELECT tree_id, task_id, root_reward, n_valid,
           CASE WHEN invalid_reason IS NOT NULL THEN NULL
                WHEN n_valid > 1 THEN (valid_sum - root_reward) / (n_valid - 1)
                WHEN $single_tree_groups = 'zero_baseline' THEN 0.0
           END AS baseline,
           coalesce(invalid_reason,
                    CASE WHEN n_valid = 1 AND $single_tree_groups = 'skip' THEN 'single_tree_group' END
           ) AS drop_reason
    FROM groups
),
-- A group whose every scored node has advantage 0 carries no signal (the reference skips it).
zero_groups AS (
    SELECT b.task_id
    FROM node_rewards r JOIN baselines b USING (tree_id)
    WHERE b.drop_reason IS NULL
    GROUP BY b.task_id
    HAVING bool_and(abs(r.reward - b.baseline) < 1e-12)
)
SELECT b.tree_id, b.task_id, b.root_reward, b.n_valid, b.baseline,
       CASE WHEN b.drop_reason IS NULL AND z.task_id IS NOT NULL AND $zero_advantage_groups = 'skip'
                THEN 'zero_advantage_group'
            ELSE b.drop_reason
       END AS drop_reason
FROM baselines b LEFT JOIN zero_groups z USING (task_id);
