from orchestrator.scheduler import partition


def test_consecutive_safe_calls_batch_and_unsafe_calls_run_alone() -> None:
    calls = ["r1", "r2", "W1", "r3", "W2", "W3", "r4", "r5", "r6"]
    batches = partition(calls, lambda c: c.startswith("r"))
    assert batches == [["r1", "r2"], ["W1"], ["r3"], ["W2"], ["W3"], ["r4", "r5", "r6"]]


def test_empty() -> None:
    assert partition([], lambda c: True) == []
