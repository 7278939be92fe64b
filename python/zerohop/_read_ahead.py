"""`safe_open`'s read-ahead.

A read of a tensor through `safe_open` costs its call (about half a
millisecond for 1 MiB into a GPU on the H200 machine; an engine call's start
and end cost a millisecond or more whatever its size) beside its bytes, and
a program reading them in order reads the ones after too (a tensor-parallel
rank takes its part of every tensor). So once two reads go forward in the
file's order or the names' (keys()), or the first read takes the first
tensor of either order, the tensors that come next in that order are read
with it (while a read goes forward in both and they differ, only those
both take next, until a read settles the order), in one engine call: a
window of
READ_AHEAD_FIRST bytes, twice as many each time up to READ_AHEAD_MOST, and
the READ_AHEAD_WINDOWS windows after it are read on threads while this one
is used (all of them queued while the first is read; after a first read,
one, as that read may be all a program wants). A tensor whose rows to
read are more than a window's bytes is a window of its own. Into a device, a
window queued while the one before it is read joins that read: one pipeline
run of the engine takes them in turn, with no transfer's start and end
between them. While reads take every tensor of each window in turn, windows
grow four times as fast, up to READ_AHEAD_DENSE_MOST. Reads that jump about
get no window, and a window that memory cannot hold is not read (the read
goes alone). A read of more than READ_AHEAD_TENSOR_BYTES is read alone,
only the rows asked, and windows pass over a tensor whose rows to read are
more; objects in a store are never read ahead. About the last
READ_AHEAD_LAST bytes of an order are a window of their own, so that the
program takes the tensors of the window before while they are read.

A window holds of each tensor the rows the last read of its kind asked for
(its name with the numbers left out: `layers.#.q.weight`), as a fraction of
its rows; of a kind not read yet, all of it. In a file of layers, a window
ends before a tensor of a kind not read yet (unless it is the window's
first): a tensor-parallel rank asks its rows of some kinds and every row
of others, and windows planned before the first layer's kinds were read
held several layers whole. A read the window holds
exactly is its tensor, made while the window was read; one it holds more
than is a copy of the rows; one it does not hold is read alone, and the
windows stay."""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from . import _buffers, _native
from ._file_tensors import _placed, _Tensor

# Larger reads are read alone: their call's own cost is small beside
# their bytes. Smaller ones read alone each paid it: 64 tensors of
# 128 MiB, half of each asked, came at 18 - 20 GB/s against 44.5 for the
# half of one tensor of 8 GiB; the halves of 4 tensors of 2 GiB, each
# read alone, at 32.28 / 31.91 against 37.35 / 34.96 (H100 machines,
# bench/matrix.py). As large as the largest window: what is read ahead
# stays within READ_AHEAD_WINDOWS of those.
READ_AHEAD_TENSOR_BYTES = 1 << 30
# Fewer, larger first windows: the halves of 3,280 tensors of 1 - 4 MiB
# came at 38.36 / 35.59 and 37.59 / 36.80 GB/s (best / median of 3, two
# runs on an H100 machine) from 64 MiB, against 32.40 / 28.05 and
# 36.98 / 35.63 from 16 (bench/probe/slice_windows.py).
READ_AHEAD_FIRST = 64 << 20
READ_AHEAD_MOST = 128 << 20
# Windows taken densely cost no memory beyond the tensors given out but
# the windows read ahead, and each window's engine call has a fixed cost
# on top of its transfer (its workers' start, and the copies into the
# device left when the last copy out of the file ends): they grow faster,
# and larger.
READ_AHEAD_DENSE_MOST = 1 << 30
# About what a read-ahead's last window holds, where the one before would
# hold more: the program takes a window's tensors once it is read, so the
# tensors of the last window are taken after every byte is read. Taking a
# tensor costs about 6.5 us, while the engine reads its half (1.3 MiB) in
# about 30: 128 MiB are read in about the time the program takes the
# tensors of the 0.6 GiB before them (the 3,280 small FP8 tensors' last
# window, taken in 3.6 ms after its read on an H100 machine:
# bench/probe/slice_windows.py).
READ_AHEAD_LAST = 128 << 20
# Windows read ahead of the one in use: each is planned and queued while
# the ones before it are read, so the engine goes from one to the next at
# once.
READ_AHEAD_WINDOWS = 2
# How far ahead in an order the next read may land and still count as
# going forward (a program may skip a few tensors of each layer).
READ_AHEAD_STRIDE = 4
# Where the names' order is in _ReadAhead.orders (the data's is first).
NAMES = 1
# The largest denominator of the fractions that describe rows asked.
_MOST_PARTS = 64


@functools.lru_cache(maxsize=4096)
def _fraction(row: int, rows: int) -> Tuple[int, int]:
    """The simplest p/q with `rows * p // q == row`, q at most _MOST_PARTS:
    `[:n // 2]` is 1/2 of every tensor, rank 3 of 8 starts at 3/8, whatever
    the rows; else `row` of `rows` itself."""
    for q in range(1, _MOST_PARTS + 1):
        p = -(-row * q // rows)
        if rows * p // q == row:
            return p, q
    return row, rows


def _goes_forward(place: Dict[str, int], name: str, last: Optional[str]) -> bool:
    """Whether a read of `name` after one of `last` (None: none before it)
    goes forward in an order (`place`: each name's place in it). A first
    read of the first tensor counts: a program reading a file through
    takes it first, and then reads each file it opens in one run of
    windows, rather than after a read alone and a window read alone
    (docs/performance.md, `get_slice`)."""
    if last is None:
        return place[name] == 0
    return 0 < place[name] - place[last] <= READ_AHEAD_STRIDE


def _own(x: Any) -> Any:
    """A copy of a view, in memory of its own."""
    return x.clone() if hasattr(x, "clone") else x.copy()


class _Window:
    """Parts of tensors read together: `parts[k]` (which rows of which
    tensor) is `tensors[k]`, None once given out."""

    def __init__(self, parts: List[_Tensor], memory: _buffers.Allocation, stream: Optional[int], order: int, after: int):
        self.parts = parts
        self.place = {p.name: k for k, p in enumerate(parts)}
        self.memory = memory
        self.tensors: List[Optional[Any]] = []
        # Only on the stream it was read on: torch may hand its memory out
        # again once it is dropped, ordered after that stream only.
        self.stream = stream
        self.order = order  # which of _ReadAhead.orders it follows
        self.after = after  # the place in that order after its last tensor
        # Whether reads have taken its tensors one after another from the
        # first: then each may be given out as it is, a view of a block the
        # window shares (freed when all its views are), as it holds nothing
        # the program passed over.
        self.dense = True
        self.last = -1

    def has(self, name: str, stream: Optional[int]) -> bool:
        return name in self.place and self.stream == stream

    def take(self, asked: _Tensor) -> Optional[Any]:
        """`asked` as a tensor of the caller's, or None where the window
        does not hold it (or gave it out already)."""
        k = self.place[asked.name]
        part, held = self.parts[k], self.tensors[k]
        if held is None or not part.begin <= asked.begin <= asked.end <= part.end:
            return None
        self.dense = self.dense and k == self.last + 1
        self.last = k
        if (asked.begin, asked.end) == (part.begin, part.end):
            if self.dense or self.memory.blocks[k] is None:
                self.tensors[k] = None  # the caller's from now on
                return held
            return _own(held)
        if len(part.shape) < 2 and part.dtype in _buffers._PACKED:
            return None  # its rows are not its elements
        first = (asked.begin - part.begin) // ((part.end - part.begin) // part.shape[0])
        return _own(held[first:first + asked.shape[0]])


class _WindowRead:
    """A window read on native threads that never hold the GIL, after the
    read before it (`behind`): into a device it joins that read's pipeline
    run while it runs, so that the engine takes them in order and goes from
    one to the next at once. Its tensors are made on the caller's thread
    meanwhile. The memory is allocated on the caller's thread and stream."""

    def __init__(self, sources: Any, parts: List[_Tensor], device: str, framework: str,
                 stream: Optional[int], order: int, after: int, behind: Optional["_WindowRead"]):
        memory, pieces = _placed(parts, device, framework)
        self.window = _Window(parts, memory, stream, order, after)
        # The read holds `memory` until it is over, whatever happens to
        # this object.
        behind_read = behind._read if behind is not None else None
        self._read = _native.read_queued(device, sources, pieces, stream, memory.regions, memory,
                                         after=behind_read) if pieces else None
        self.window.tensors = memory.tensors()

    def wait(self) -> _Window:
        if self._read is not None:
            self._read.wait()
        return self.window

    def settle(self) -> None:
        """Waits for the read to be over; its window is not used, nor its
        error (a read of it would read it again, and raise)."""
        try:
            self.wait()
        except Exception:
            pass


class _ReadAhead:
    """One file's read-ahead: the window in use, the ones read after it,
    the reads that decide the next, and the rows asked of each kind."""

    def __init__(self, tensors: Iterable[_Tensor]):
        tensors = list(tensors)
        self.orders = (sorted(tensors, key=lambda t: t.begin), sorted(tensors, key=lambda t: t.name))
        self.places = [{t.name: i for i, t in enumerate(order)} for order in self.orders]
        # Which of the orders the windows follow (None before the first).
        self.order: Optional[int] = None
        self.window: Optional[_Window] = None
        # The windows after the one in use, in order, being read.
        self.ahead: List[_WindowRead] = []
        self.last: Optional[str] = None
        self.windows = 0
        # Whether every window let go of so far was taken densely.
        self.dense = True
        # Per kind, the rows last asked: fractions of the first and the
        # last row's end.
        self.asked: Dict[str, Tuple[Tuple[int, int], Tuple[int, int]]] = {}
        self._layered: Optional[bool] = None

    def read(self, info: _Tensor, asked: _Tensor, sources: Callable[[], Any], device: str, framework: str,
             check: Callable[[], None]) -> Optional[Any]:
        """`asked` (rows of `info`) out of a window, read now (after
        `check()`) if reads go forward; None when it is to be read alone."""
        stream = _buffers.current_stream(device)
        last, self.last = self.last, info.name
        self._learn(info, asked)
        if asked.end - asked.begin > READ_AHEAD_TENSOR_BYTES:
            return None  # and the windows stay: small tensors may follow
        if self.window is None or not self.window.has(info.name, stream):
            self._let_go()  # freed before the next is allocated
            check()
            if not (self.ahead and self.ahead[0].window.has(info.name, stream)):
                self.close()
                forward = [k for k, place in enumerate(self.places) if _goes_forward(place, info.name, last)]
                if not forward:
                    return None
                k, until = self._follow(info.name, forward)
                first = self._read(k, self.places[k][info.name], sources(), device, framework, stream, None, until)
                if first is None:
                    return None
                self.ahead = [first]
            # The windows after are queued before the wait: the engine goes
            # on to them as this one ends, and their memory and tensors are
            # made while it reads. At most 1 + READ_AHEAD_WINDOWS are held,
            # none in use meanwhile; after a first read, 2: that read may be
            # all the program wants of the file; none while the order to
            # follow is undecided.
            while self.order is not None and len(self.ahead) <= (READ_AHEAD_WINDOWS if last is not None else 1):
                behind = self.ahead[-1]
                read = self._read(behind.window.order, behind.window.after, sources(), device, framework,
                                  stream, behind)
                if read is None:
                    break
                self.ahead.append(read)
            if not self.ahead[0].window.has(info.name, stream):
                return None  # the rows it would read are too many: alone, and the windows stay
            try:
                self.window = self.ahead.pop(0).wait()
            except BaseException:
                self.close()  # the windows after it start anew at the next read
                raise
            check()
        return self.window.take(asked)

    def _follow(self, name: str, forward: List[int]) -> Tuple[int, Optional[int]]:
        """Of the orders the reads go forward in to `name`, the one to read
        ahead in, and where its window must end (None: where its budget
        does). The windows keep to the order they follow. A file whose
        data lies in another order than its names' (written as its tensors
        came, not sorted) starts both orders with the same tensor, and
        often the same few: until a read leaves one order, a window holds
        only the tensors both take next, and none is read ahead of it.
        Read ahead in the file's order from the first read, a program
        going through keys() had 1.50 x the bytes it asked read of 4
        shards of 16 tensors (docs/performance.md, `get_slice`). The
        windows of a new order grow from the first size again."""
        if self.order in forward:
            return self.order, None
        k = forward[0]
        if len(forward) > 1:
            data, names = self.orders
            i, j = self.places[0][name], self.places[NAMES][name]
            same = 0
            while i + same < len(data) and j + same < len(names) and data[i + same] is names[j + same]:
                same += 1
            if i + same < len(data) and j + same < len(names):
                return 0, i + same  # undecided
            k = NAMES
        self.order, self.dense, self.windows = k, True, 0
        return k, None

    def _is_layered(self) -> bool:
        """Whether the file is made of layers, each kind four times or more
        on average: then its first layer shows what a program asks of each
        kind, and a window ends before a kind not read yet (unless it is
        the window's first). A file of names that do not repeat has no
        kind to learn. Found when first needed: the kinds of 3,280 names
        take milliseconds."""
        if self._layered is None:
            tensors = self.orders[0]
            self._layered = 4 * len({t.kind for t in tensors}) <= len(tensors)
        return self._layered

    def _learn(self, info: _Tensor, asked: _Tensor) -> None:
        rows = info.shape[0] if info.shape else 0
        if not rows or (info.end - info.begin) % rows or asked.end <= asked.begin:
            return
        row_bytes = (info.end - info.begin) // rows
        start, stop = (asked.begin - info.begin) // row_bytes, (asked.end - info.begin) // row_bytes
        self.asked[info.kind] = (_fraction(start, rows), _fraction(stop, rows))

    def _predicted(self, t: _Tensor) -> _Tensor:
        """The rows of `t` that a read of it will likely ask for."""
        asked = self.asked.get(t.kind)
        rows = t.shape[0] if t.shape else 0
        if asked is None or not rows or (t.end - t.begin) % rows:
            return t
        (p, q), (r, s) = asked
        start, stop = rows * p // q, rows * r // s
        if not 0 <= start < stop <= rows or (start, stop) == (0, rows):
            return t
        return t.rows(start, stop)

    def _read(self, k: int, i: int, sources: Any, device: str, framework: str,
              stream: Optional[int], behind: Optional[_WindowRead], until: Optional[int] = None) -> Optional[_WindowRead]:
        """Starts reading the window of order `k` from place `i` on, before
        place `until` if given (once `behind` is read): the tensors there
        up to the next budget, or
        the first alone where it is larger (tensors whose rows to read
        are over READ_AHEAD_TENSOR_BYTES are skipped: they are read
        alone). None when none are left."""
        order = self.orders[k]
        picked: List[_Tensor] = []
        places: List[int] = []  # where each of `picked` is in the order
        most, growth = (READ_AHEAD_DENSE_MOST, 2) if self.dense else (READ_AHEAD_MOST, 1)
        budget = min(most, READ_AHEAD_FIRST << min(growth * self.windows, 20))
        total = 0
        end = len(order) if until is None else until
        while i < end:
            if picked and order[i].kind not in self.asked and self._is_layered():
                break  # what the program asks of this kind is not known yet
            part = self._predicted(order[i])
            n = part.end - part.begin
            if n <= READ_AHEAD_TENSOR_BYTES:
                if picked and total + n > budget:
                    break
                picked.append(part)
                places.append(i)
                total += n
            i += 1
        if not picked:
            return None
        if i == len(order) and len(picked) > 1 and total > 2 * READ_AHEAD_LAST:
            # The order's end: its last READ_AHEAD_LAST bytes or so are the
            # next window.
            kept, last = len(picked), 0
            while kept > 1 and last < READ_AHEAD_LAST:
                kept -= 1
                last += picked[kept].end - picked[kept].begin
            picked, i = picked[:kept], places[kept]
        self.windows += 1
        try:
            return _WindowRead(sources, picked, device, framework, stream, k, i, behind)
        except Exception as e:
            if _buffers.out_of_memory(e):
                return None  # what is asked is read alone, in memory of its own
            raise

    def _let_go(self) -> None:
        if self.window is not None:
            self.dense = self.dense and self.window.dense
        self.window = None

    def close(self) -> None:
        """Lets the windows go, once a read under way is over."""
        self._let_go()
        for read in self.ahead:
            read.settle()
        self.ahead = []
