-- What the training stage reads for one round (rao_core/train/samples.py: COLUMNS, in this order):
-- every trained node's tokens, action mask, sampler log-probs, w_d * A, and the temperature its
-- log-probs were taken at. Parameter: $round.
SELECT node_id, token_ids, action_mask, logprobs, weighted_advantage, temperature
FROM samples
WHERE round = $round;
