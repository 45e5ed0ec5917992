"""Update engines: turn a loss into an optimizer step (DeepSpeed for transformers, plain torch for the toy)."""
