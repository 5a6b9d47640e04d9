-- One tree's nodes for the tree viewer (rao show, rao_core/eval/viewer.py), parents before their
-- children and siblings in launch order (depth-first on the node path, 0.2 before 0.10), with the
-- node's reward and advantage when its round has been scored (NULL, and scored = false, if not).
-- $round NULL means the latest round that holds the tree (a task id may come back in later rounds).
SELECT n.run, n.round, n.task_id, n.tree_id, n.node_id, n.parent_id, n.depth, n.mode,
       n.difficulty, n.policy_version, n.goal, n.targets, n.status, n.finish_message, n.success,
       n.success_source, n.tree_status, n.turns, n.children, n.refused_launches,
       n.prompt_tokens, n.action_tokens, n.started_at, n.ended_at, n.transcript,
       s.node_id IS NOT NULL AS scored, s.reward, s.baseline, s.advantage, s.trained, s.drop_reason
FROM nodes n
LEFT JOIN scores s ON s.round = n.round AND s.node_id = n.node_id
WHERE n.tree_id = $tree_id
  AND n.round = coalesce($round, (SELECT max(round) FROM nodes WHERE tree_id = $tree_id))
ORDER BY CAST(string_split(regexp_extract(n.node_id, '[^:]*$'), '.') AS INTEGER[]);
