"""The mixture order (lib/order/npyload_mix.h) against an independent
reference written from that header's text (mix_reference.py), and the
running digest (lib/order/npyload_digest.h) against PyPI's xxhash.

The C side is tests/mix_dump, a driver built with the tests that answers a
script on stdin: the loader does not mix yet, and lib/order's mixture is
internal, so the driver is how the C is reached without a public API.
"""
import collections
import math
import random
import struct
import subprocess

import pytest

from conftest import built_tool
from mix_reference import Mixture, quantize
from test_order_vs_torch import FULL, LOCAL, NONE, ref_perm, ref_rank

ESTATE, ETOOBIG, EMISMATCH, EINVAL = -10006, -10008, -10005, -10001


class Dump:
    """tests/mix_dump: one command a line, one answer a line."""

    def __init__(self):
        self.p = subprocess.Popen([built_tool("mix_dump", "tests")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, bufsize=1)

    def ask(self, *words):
        self.p.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline().split()
        assert line, "mix_dump gave no answer"
        return line

    def ok(self, *words):
        got = self.ask(*words)
        assert got[0] != "err", " ".join(got)
        return got

    def err(self, *words):
        got = self.ask(*words)
        assert got[0] == "err", f"{words[0]} accepted: {' '.join(got)}"
        return int(got[1])

    def new(self, m):
        """The mixture of a reference Mixture (its initial weights)."""
        words = [m.T if m.T != sum(m.n) else 0, m.B, m.shuffle, m.seed,
                 m.window, m.K]
        for k in range(m.K):
            fs = m.files[k] if m.files else []
            words += [m.n[k], len(fs)] + list(fs)
        words += [repr(float(w)) for w in m.initial]
        return self.ask("new", *words)

    def rows(self, epoch, world=1, rank=0, drop=0, bs=1, base=0):
        got = self.ok("rows", epoch, world, rank, drop, bs, base)
        vals = list(map(int, got[2:]))
        return [tuple(vals[i:i + 3]) for i in range(0, len(vals), 3)]

    def draws(self, epoch, pos):
        return list(map(int, self.ok("draws", epoch, pos)[1:]))

    def setw(self, epoch, pos, weights):
        return self.ok("setw", epoch, pos, *[repr(float(w)) for w in weights])

    def close(self):
        self.p.stdin.close()
        assert self.p.wait(timeout=60) == 0


@pytest.fixture(scope="module")
def dump():
    d = Dump()
    yield d
    d.close()


def random_mixture(rng):
    K = rng.choice([1, 1, 2, 2, 3, 4, 5, 17])
    sizes = [rng.choice([0, 1, 2, 3, 7, 20, 41, 64]) for _ in range(K)]
    if not any(sizes):
        sizes[0] = 5
    weights = [rng.choice([0.0, 0.1, 0.3, 1.0, 2.5, 1e-12]) if n else 0.0
               for n in sizes]
    if not any(weights):
        weights[next(k for k in range(K) if sizes[k])] = 1.0
    shuffle = rng.choice([NONE, FULL, FULL, LOCAL])
    files = None
    if shuffle == LOCAL:
        files = []
        for n in sizes:
            fs, left = [], n
            while left:
                f = rng.randint(1, max(1, left))
                fs.append(f)
                left -= f
            files.append(fs)
    T = rng.choice([0, 0, 1, 13, 100, 257])
    if T == 0 and sum(sizes) == 0:
        T = 10
    return Mixture(sizes, weights, T=T, B=rng.choice([0, 1, 3, 7, 64]),
                   shuffle=shuffle, seed=rng.randint(-2**63, 2**63 - 1),
                   window=rng.choice([0, 1, 2]), files=files)


@pytest.mark.parametrize("case", range(150))
def test_matches_reference(dump, case):
    rng = random.Random(case)
    m = random_mixture(rng)
    assert dump.new(m) == ["ok"]
    epochs = 3
    seqs, starts = m.run(epochs)
    for e in range(epochs):
        assert dump.rows(e) == seqs[e], (case, e)
        assert dump.draws(e, 0) == starts[e]
        p = rng.randrange(m.T + 1)
        exp = list(starts[e])
        for k, _, _ in seqs[e][:p]:
            exp[k] += 1
        assert dump.draws(e, p) == exp, (case, e, p)
        world = rng.randint(2, 5)
        drop, bs = rng.randint(0, 1), rng.choice([1, 2, 5, 64])
        base = rng.choice([0, rng.randrange(m.T + 1)])
        for r in range(world):
            assert dump.rows(e, world, r, drop, bs, base) == \
                ref_rank(seqs[e][base:], world, r, drop, bs), (case, e, r)


@pytest.mark.parametrize("shuffle", [NONE, FULL, LOCAL])
@pytest.mark.parametrize("seed", [0, 42, -7, 2**63 - 1])
def test_one_source_is_the_plain_order(dump, shuffle, seed):
    files = [[5, 9, 1, 16, 3]] if shuffle == LOCAL else None
    m = Mixture([34], [0.7], shuffle=shuffle, seed=seed, window=2, files=files)
    dump.new(m)
    for e in range(4):
        perm = ref_perm(34, shuffle, seed, e, files[0] if files else None, 2)
        assert [i for _, i, _ in dump.rows(e)] == perm
        assert {q for _, _, q in dump.rows(e)} == {e}


def test_passes_cycle_a_small_source(dump):
    """A 7-sample source at weight 0.5 of 1000 positions: a new permutation
    every pass; the 500-sample source is read once before it repeats."""
    m = Mixture([7, 500], [1, 1], T=1000, seed=3)
    dump.new(m)
    small = collections.defaultdict(list)
    big = []
    for e in range(2):
        for k, i, q in dump.rows(e):
            (small[q] if k == 0 else big).append(i)
    full = [p for p in small.values() if len(p) == 7]
    assert len(full) >= 140
    assert all(sorted(p) == list(range(7)) for p in full)
    assert len({tuple(p) for p in full}) > 100  # each pass its own order
    assert sorted(big[:500]) == list(range(500))


def test_proportions(dump):
    """Global counts hold the weights to within ceil(log2 K)/2 at every
    epoch start, however far (no drift); a rank's share over many epochs
    is within binomial bounds (the in-block shuffle is unbiased)."""
    w = [0.5, 0.3, 0.15, 0.05]
    U = quantize(w)
    m = Mixture([50, 500, 20, 3], w, T=1000, seed=11)
    dump.new(m)
    for e in (1, 2, 3, 10, 1000, 10**6, 10**9):
        got = dump.draws(e, 0)
        for k in range(4):
            assert abs(got[k] - e * 1000 * U[k] / sum(U)) <= 1.0, (e, k, got)
    world, epochs = 4, 150
    counts = [collections.Counter() for _ in range(world)]
    for e in range(epochs):
        for r in range(world):
            counts[r].update(k for k, _, _ in dump.rows(e, world, r))
    rows = epochs * 250
    for r in range(world):
        for k in range(4):
            sd = math.sqrt(rows * w[k] * (1 - w[k]))
            assert abs(counts[r][k] - rows * w[k]) <= 4.5 * sd, (r, k, counts[r])


@pytest.mark.parametrize("old_world,new_world", [(2, 3), (3, 2), (4, 1), (1, 5)])
@pytest.mark.parametrize("drop", [0, 1])
def test_elastic_resume_covers_the_rest(dump, old_world, new_world, drop):
    m = Mixture([40, 90, 13], [0.2, 0.5, 0.3], T=300, seed=5)
    dump.new(m)
    full = dump.rows(2)
    bs, consumed_batches = 4, 7
    P = min(300, consumed_batches * bs * old_world)
    before = []
    for r in range(old_world):
        before += dump.rows(2, old_world, r, drop, bs)[:consumed_batches * bs]
    after = []
    for r in range(new_world):
        mine = dump.rows(2, new_world, r, drop, bs, base=P)
        assert mine == ref_rank(full[P:], new_world, r, drop, bs)
        after += mine
    got, want = collections.Counter(before + after), collections.Counter(full)
    missing = want - got
    extra = got - want
    if drop:
        assert sum(missing.values()) < new_world * bs + old_world
    else:
        assert not missing
        assert sum(extra.values()) <= new_world - 1


def curriculum():
    """Weights per epoch, a change mid-epoch 3 and a no-op."""
    m = Mixture([30, 70, 9], [0.6, 0.3, 0.1], T=120, B=16, seed=99)
    m.set_weights(2, 0, [0.2, 0.2, 0.6])
    m.set_weights(3, 37, [0.0, 0.5, 0.5])
    m.set_weights(4, 0, [0.0, 0.5, 0.5])   # the same: nothing changes
    m.set_weights(4, 120, [1.0, 1.0, 1.0])  # the end: epoch 5's start
    return m


def play(dump, m, epochs, start=(0, 0), stop=None):
    """The C rows of the Mixture's schedule at world size 1 from `start`
    (the C mixture set up to that point) to the end of epoch epochs-1, a
    list per epoch. With stop=(epoch, pos): returns there, before that
    point's change, with the saved state."""
    out = []
    for e in range(start[0], epochs):
        base = start[1] if e == start[0] else 0
        seq = []
        points = {p for (ce, p) in m.changes if ce == e and p >= base}
        if stop and stop[0] == e:
            points.add(stop[1])
        for p in sorted(points) + [m.T]:
            if p > base:
                seq += dump.rows(e, 1, 0, 0, 1, base)[:p - base]
                base = p
            if stop == (e, p):
                return out + [seq], dump.ok("save")[1]
            if (e, p) in m.changes:
                dump.setw(e, p, m.changes[(e, p)])
        out.append(seq)
    return out, None


def test_curriculum_matches_reference(dump):
    m = curriculum()
    seqs, starts = m.run(6)
    dump.new(m)
    got, _ = play(dump, m, 6)
    assert got == seqs
    assert dump.draws(5, 0) == starts[5]
    # what came before the last change is refused, not guessed
    assert dump.err("rows", 4, 1, 0, 0, 1, 0) == ESTATE


@pytest.mark.parametrize("stop", [(3, 37), (4, 0), (2, 0), (1, 50)])
@pytest.mark.parametrize("world", [1, 3])
def test_curriculum_resumed_midway(dump, stop, world):
    """Stop at a point, save, start a new mixture with the initial weights,
    load, go on (the script sets its schedule's weights again): the rows
    are those of the uninterrupted run, at the same or another world
    size."""
    m = curriculum()
    seqs, _ = m.run(6)
    dump.new(m)
    head, state = play(dump, m, 6, stop=stop)
    assert state is not None
    assert head[-1] == seqs[stop[0]][:stop[1]]
    dump.new(m)  # a new process starts from the initial weights
    assert dump.ok("load", state) == ["ok"]
    e, p = stop
    if (e, p) in m.changes:
        dump.setw(e, p, m.changes[(e, p)])
    for r in range(world):  # (no later change in these stops' epochs)
        assert dump.rows(e, world, r, 0, 1, p) == ref_rank(seqs[e][p:], world, r, 0, 1)
    rest, _ = play(dump, m, 6, start=(e + 1, 0))
    assert rest == seqs[e + 1:]


def test_refusals(dump):
    m = Mixture([10, 10], [1, 1], T=20, seed=1)
    dump.new(m)
    dump.setw(3, 5, [1, 3])
    assert dump.err("rows", 2, 1, 0, 0, 1, 0) == ESTATE
    assert dump.err("draws", 3, 4) == ESTATE
    assert dump.err("at", 3, 4) == ESTATE
    assert dump.ok("at", 3, 5, 19)
    assert dump.err("at", 3, 20) == EINVAL
    assert dump.err("draws", 2**62, 0) == ETOOBIG
    assert dump.err("setw", 3, 6, "nan", 1) == EINVAL
    assert dump.err("setw", 3, 6, 0, 0) == EINVAL
    assert dump.err("new", 0, 0, 1, 0, 0, 2, 0, 0, 5, 0, 1.0, 1.0) == EINVAL
    assert dump.err("new", 0, 2**21, 1, 0, 0, 1, 5, 0, 1.0) == EINVAL


def test_state_refuses_another_mixture(dump):
    m = Mixture([10, 10], [1, 1], T=20, seed=1)
    dump.new(m)
    state = dump.ok("save")[1]
    dump.new(Mixture([10, 11], [1, 1], T=20, seed=1))
    assert dump.err("load", state) == EMISMATCH
    dump.new(Mixture([10, 10], [1, 1], T=21, seed=1))
    assert dump.err("load", state) == EMISMATCH
    dump.new(Mixture([10, 10, 1], [1, 1, 1], T=20, seed=1))
    assert dump.err("load", state) == EMISMATCH
    dump.new(m)
    assert dump.err("load", state[:-2]) == EINVAL
    assert dump.err("load", "00" + state[2:]) == EINVAL


# ---- the running digest ----------------------------------------------------

def ref_digest(digest, source, index, augs=()):
    """npyload_digest.h, from its text: XXH3-64 of the record."""
    xxhash = pytest.importorskip("xxhash", reason="PyPI's xxhash (the test extra)")
    rec = struct.pack("<QIIq", digest, source, len(augs), index)
    for hflip, vflip, top, left in augs:
        rec += struct.pack("<BB6xqq", hflip, vflip, top, left)
    return xxhash.xxh3_64_intdigest(rec)


def test_digest_matches_xxhash(dump):
    rng = random.Random(7)
    d_c = d_py = 0
    for r in range(400):
        naug = rng.choice([0, 0, 1, 2, 8, 9, 20])
        augs = [(rng.randint(0, 1), rng.randint(0, 1), rng.randint(0, 300),
                 rng.randint(-5, 2**40)) for _ in range(naug)]
        src, idx = rng.randint(0, 2**32 - 1), rng.randint(-2**63, 2**63 - 1)
        words = [d_c, src, idx, naug] + [v for a in augs for v in a]
        d_c = int(dump.ok("digest", *words)[1])
        d_py = ref_digest(d_py, src, idx, augs)
        assert d_c == d_py, r
