-- Totals of one scored round (rao_core.scoring.scores_summary); reads a `scores` table of one round.
SELECT count(*) AS nodes,
       count(*) FILTER (WHERE trained) AS trained_nodes,
       count(DISTINCT tree_id) AS trees,
       avg(reward) AS mean_reward,
       avg(advantage) FILTER (WHERE trained) AS mean_advantage_trained,
       avg(reward) FILTER (WHERE parent_id IS NULL) AS mean_root_reward
FROM scores;
