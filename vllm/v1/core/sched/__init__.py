"""The V1 scheduler: policy queues, the scheduler and its async variant."""
