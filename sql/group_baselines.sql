-- Eq. 3 of RAO, one row per tree: the leave-one-out baseline and whether the tree is trained.
--   b_{-g} = (sum of the OTHER valid trees' root rewards in the task's group) / (number of them)
-- A group is a root task (task_id) within the round. Which trees are valid, and what happens to
-- groups the equation cannot serve, are settings (docs/scoring.md):
--   * sampled more than $max_staleness versions before the one this round trains
--                                            -> always dropped ('stale'): the bound on off-policy data
--   * tree_status = 'timeout'                -> always dropped from its group ('timeout')
--   * tree_status = 'infra_error'            -> always dropped: a component failed, not the policy
--                                               ('infra_error', rao_core/errors.py)
--   * root status != 'finished'              -> $unfinished_roots: 'keep' | 'drop' ('unfinished_root')
--   * one valid tree in the group            -> $single_tree_groups: 'skip' ('single_tree_group')
--                                               | 'zero_baseline' (b = 0, A = R)
--   * every node advantage of the group is 0 -> $zero_advantage_groups: 'skip' ('zero_advantage_group')
--                                               | 'keep'
-- drop_reason IS NULL means the tree's nodes are trained. Reads only the temp table trees (one row
-- per tree, keyed by hash(tree_id); task_key = hash(task_id)): no pass over the node rows.
CREATE OR REPLACE TEMP TABLE tree_baselines AS
WITH validity AS (
    SELECT tree_key, task_key, root_reward, reward_lo, reward_hi,
           CASE WHEN staleness > $max_staleness THEN 'stale'
                WHEN timed_out THEN 'timeout'
                WHEN infra_failed THEN 'infra_error'
                WHEN $unfinished_roots = 'drop' AND root_unfinished THEN 'unfinished_root'
           END AS invalid_reason
    FROM trees
),
-- Group totals over valid trees only; each tree then subtracts itself (leave-one-out).
groups AS (
    SELECT *,
           count(*) FILTER (WHERE invalid_reason IS NULL) OVER (PARTITION BY task_key) AS n_valid,
           sum(root_reward) FILTER (WHERE invalid_reason IS NULL) OVER (PARTITION BY task_key) AS valid_sum
    FROM validity
),
baselines AS (
    SELECT tree_key, task_key, root_reward, reward_lo, reward_hi, n_valid,
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
-- Per tree, all abs(R - b) < 1e-12 is decided exactly from the tree's min and max R (trees.sql).
zero_groups AS (
    SELECT task_key
    FROM baselines
    WHERE drop_reason IS NULL
    GROUP BY task_key
    HAVING bool_and(reward_hi - baseline < 1e-12 AND baseline - reward_lo < 1e-12)
)
SELECT b.tree_key, b.task_key, b.root_reward, b.n_valid, b.baseline,
       CASE WHEN b.drop_reason IS NULL AND z.task_key IS NOT NULL AND $zero_advantage_groups = 'skip'
                THEN 'zero_advantage_group'
            ELSE b.drop_reason
       END AS drop_reason
FROM baselines b LEFT JOIN zero_groups z USING (task_key);
