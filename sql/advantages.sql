-- Eq. 3 and 5 of RAO, one row per node, in the nodes file's order: the computed scores columns.
--   A(X) = R(X) - b_{-g}   (the same baseline for every node of tree g)
--   weighted_advantage = w_{depth(X)} * A(X) for trained nodes, 0 otherwise
--   staleness: how many versions older than the one trained the node's sampler was (node_rewards.sql)
-- Nodes of dropped trees (baseline NULL) get advantage 0. Untrained nodes keep the w of their depth
-- when that depth has trained nodes (else NULL), but their weighted advantage is always 0.
-- The id columns of the scores table (run, round, task_id, tree_id, node_id, parent_id, depth) are
-- not selected here: scoring.py copies them from the nodes file, whose order ORDER BY row_nr keeps
-- (joining strings back costs more than the whole computation).
-- Reads the temp tables node_rewards, tree_baselines, depth_counts. Parameter: $depth_weighting.
SELECT r.success, r.reward,
       t.baseline,
       coalesce(r.reward - t.baseline, 0.0) AS advantage,
       CASE WHEN $depth_weighting THEN d.w ELSE 1.0 END AS depth_weight,
       CASE WHEN t.drop_reason IS NULL THEN d.w * (r.reward - t.baseline) ELSE 0.0 END
           AS weighted_advantage,
       t.drop_reason IS NULL AS trained,
       t.drop_reason,
       r.staleness
FROM node_rewards r
JOIN tree_baselines t USING (tree_key)
LEFT JOIN depth_counts d USING (depth)
ORDER BY r.row_nr;
