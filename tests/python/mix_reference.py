"""The mixture order of lib/order/npyload_mix.h in plain Python, written
from that header's text, not from the C.

Where the C answers any position directly (the interleave's counts by
descending the tree, the draws before a position in O(log K)), this
reference replays the whole run from its first position: every node of the
interleave tree counts the positions that reached it, every source counts
its draws. So it checks the C's direct formulas against their meaning.

The single-source generator and permutations (Gen, ref_perm) come from
test_order_vs_torch.py, which checks them against npyload_order.h's text.
"""
import math

from test_order_vs_torch import LOCAL, M64, NONE, Gen, _mix64, ref_perm

G = 0x9E3779B97F4A7C15
ONE = 1 << 30  # the quantised weights' scale, 2^30


def quantize(weights):
    """'Weights in force': doubles to integers, summed left to right."""
    total = 0.0
    for w in weights:
        total += w
    return [0 if w == 0 else max(1, math.floor(w / total * ONE + 0.5))
            for w in weights]


def tag_seed(seed, tag):
    """seed XOR mix64(tag * G): source k's seed (tag k), block j's (2^63 + j)."""
    return (seed & M64) ^ _mix64((tag * G) & M64)


class _Node:
    """A node of the interleave tree over sources [lo, hi). It remembers how
    many positions reached it so far and routes the next one."""

    def __init__(self, U, lo, hi):
        self.lo, self.hi = lo, hi
        self.s = sum(U[lo:hi])
        self.reached = 0
        if hi - lo > 1:
            mid = lo + (hi - lo) // 2
            self.kids = (_Node(U, lo, mid), _Node(U, mid, hi))
            self.a = self.kids[0].s

    def _left(self, t):
        """Of the first t positions reaching this node, those sent left."""
        if self.s == 0:
            return 0
        q, r = divmod(t, self.s)
        return q * self.a + (2 * self.a * r + self.s) // (2 * self.s)

    def route(self):
        """The source of the next position of the stream."""
        node = self
        while node.hi - node.lo > 1:
            t = node.reached
            node.reached += 1
            node = node.kids[0] if node._left(t + 1) > node._left(t) else node.kids[1]
        return node.lo


class Mixture:
    """One run of a mixture: the configuration, the initial weights and the
    weight changes, replayed from epoch 0.

    sizes: samples per source; files: per source, its file sizes (LOCAL);
    T: samples per epoch (0: the sum); B: block (0: 64)."""

    def __init__(self, sizes, weights, T=0, B=0, shuffle=1, seed=0,
                 window=0, files=None):
        self.n = list(sizes)
        self.K = len(sizes)
        self.T = T or sum(sizes)
        self.B = B or 64
        self.shuffle, self.seed, self.window = shuffle, seed, window
        self.files = files
        self.initial = list(weights)
        self.changes = {}  # (epoch, position) -> weights
        self._perms = {}

    def set_weights(self, epoch, position, weights):
        """Weights in force from that point on; the epoch's end is the next
        epoch's start."""
        if position == self.T and self.T > 0:
            epoch, position = epoch + 1, 0
        self.changes[(epoch, position)] = list(weights)

    def _sample(self, k, c):
        """Source k's c-th draw: (index, pass)."""
        q, j = divmod(c, self.n[k])
        if self.shuffle == NONE:
            return j, q
        if (k, q) not in self._perms:
            fs = self.files[k] if self.shuffle == LOCAL else None
            self._perms[(k, q)] = ref_perm(self.n[k], self.shuffle,
                                           tag_seed(self.seed, k), q, fs,
                                           self.window)
        return self._perms[(k, q)][j], q

    def run(self, epochs):
        """The rows (source, index, pass) of every position of epochs
        0 .. epochs-1, and the draws of each source before each epoch
        (starts[e]) and after the last (starts[epochs])."""
        U = quantize(self.initial)
        stream = _Node(U, 0, self.K)
        draws = [0] * self.K
        out, starts = [], []
        for e in range(epochs):
            starts.append(list(draws))
            seq = []
            p = 0
            while p < self.T:
                w = self.changes.get((e, p))
                if w is not None and quantize(w) != U:
                    U = quantize(w)
                    stream = _Node(U, 0, self.K)  # a new segment's stream
                j = p // self.B
                hi = min((j + 1) * self.B, self.T)
                labels = [stream.route() for _ in range(hi - p)]
                if self.shuffle != NONE:
                    Gen(tag_seed(self.seed, (1 << 63) + j), e).fisher_yates(labels)
                # A real change inside the block cuts it there.
                stop = hi
                for P in range(p + 1, hi):
                    w = self.changes.get((e, P))
                    if w is not None and quantize(w) != U:
                        stop = P
                        break
                for k in labels[:stop - p]:
                    index, q = self._sample(k, draws[k])
                    draws[k] += 1
                    seq.append((k, index, q))
                p = stop
            out.append(seq)
        starts.append(list(draws))
        return out, starts
