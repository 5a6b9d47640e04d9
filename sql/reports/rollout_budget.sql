-- What each round's rollout spent: trees, nodes, sampled (action) and prompt tokens, and its
-- wall-clock. Compares the budgets of two arms (recursive against the single-agent control).
SELECT round,
       count(DISTINCT tree_id) AS trees,
       count(*) AS nodes,
       sum(action_tokens) AS sampled_tokens,
       sum(prompt_tokens) AS prompt_tokens,
       round(max(ended_at) - min(started_at), 1) AS seconds,
       round(avg(success) FILTER (WHERE parent_id IS NULL), 3) AS root_success
FROM nodes
GROUP BY round
ORDER BY round;
