-- One row per tree (tree_key = hash(tree_id)), aggregated once from node_rewards: what the checks
-- and Eq. 3 need, so no later step goes back over the node rows for tree-level facts.
--   roots, root_depth, task_lo/task_hi, kids_in_tree -> checks.sql (one root at depth 0, one task)
--   timed_out, infra_failed, staleness (its oldest node's), root_unfinished, root_reward
--                                                      -> group_baselines.sql (validity, Eq. 3)
--   reward_lo, reward_hi                               -> the zero-advantage rule: every node of the
--     tree has abs(R - b) < eps  <=>  R_max - b < eps and b - R_min < eps (floating-point
--     subtraction is monotone in R and sign-symmetric, so this is exact, not an approximation)
CREATE OR REPLACE TEMP TABLE trees AS
SELECT tree_key,
       min(task_key) AS task_key,
       max(task_key) AS task_hi,
       count(*) FILTER (WHERE parent_key IS NULL) AS roots,
       any_value(depth) FILTER (WHERE parent_key IS NULL) AS root_depth,
       bool_and(kids_in_tree) AS kids_in_tree,
       bool_or(timed_out) AS timed_out,
       bool_or(infra_failed) AS infra_failed,
       max(staleness) AS staleness,
       any_value(unfinished) FILTER (WHERE parent_key IS NULL) AS root_unfinished,
       any_value(reward) FILTER (WHERE parent_key IS NULL) AS root_reward,
       min(reward) AS reward_lo,
       max(reward) AS reward_hi
FROM node_rewards
GROUP BY tree_key;
