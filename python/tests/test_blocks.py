"""How load_file packs tensors into shared blocks of GPU memory (the plan
only: the GPU tests in test_torch.py load through it)."""

from zerohop import _buffers


def test_blocks_fill_in_order_aligned_and_never_overflow():
    sizes = [100, 0, 1000, 3000, 5000, 4096, 1, 10_000, 8]
    places = _buffers.plan_blocks(sizes, 8192)
    assert places[1] is None and places[7] is None  # empty, and too large
    used = {}
    for n, place in zip(sizes, places):
        if place is None:
            continue
        block, at = place
        assert at % 512 == 0 and at + n <= 8192
        assert all(at >= end or at + n <= start for start, end in used.get(block, []))
        used.setdefault(block, []).append((at, at + n))
    assert places[0] == (0, 0) and places[2] == (0, 512)
    assert places[4][0] == 1, "a tensor that does not fit starts the next block"
    assert places[8] == (2, 4608), "the large one in between does not end the block"
    assert [p[0] for p in places if p] == sorted(p[0] for p in places if p)
