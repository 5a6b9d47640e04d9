-- The trainer's rows: every trained node's tokens with its advantage and depth weight (Eq. 5).
-- Joined on (round, node_id): a node belongs to exactly one round's rollouts and scores.
CREATE OR REPLACE TEMP VIEW samples AS
-- temperature: what the sampler's log-probs were taken at (NULL in rows older than the column: 1).
SELECT n.node_id, n.round, n.depth, n.token_ids, n.action_mask, n.logprobs, n.temperature,
       s.advantage, s.depth_weight, s.weighted_advantage, n.policy_version
FROM nodes n
JOIN scores s ON s.round = n.round AND s.node_id = n.node_id
WHERE s.trained;
