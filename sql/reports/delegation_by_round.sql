-- Delegation in each round's training rollouts (sampled at the rollout temperature): the share of
-- trees whose root launched a sub-agent, the mean of each tree's deepest level, and root success.
-- With the evaluations' greedy figures it shows whether RL teaches the policy to delegate.
WITH trees AS (
    SELECT round,
           tree_id,
           min(policy_version) AS policy_version,
           max(depth) AS max_depth,
           max(CASE WHEN parent_id IS NULL AND children > 0 THEN 1 ELSE 0 END) AS root_delegated,
           max(success) FILTER (WHERE parent_id IS NULL) AS root_success
    FROM nodes
    GROUP BY round, tree_id
)
SELECT round,
       min(policy_version) AS policy_version,
       count(*) AS trees,
       round(avg(root_delegated), 3) AS root_delegation_rate,
       round(avg(max_depth), 3) AS mean_max_depth,
       round(avg(coalesce(root_success, 0)), 3) AS root_success
FROM trees
GROUP BY round
ORDER BY round;
