"""Sample order vs torch.utils.data.DistributedSampler, and vs an independent
reimplementation of the generator written from the text in
lib/order/npyload_order.h alone (this proves the documentation is exact).

Loads $NPYLOAD_BUILD_DIR/lib/libnpyload.so (default <repo>/build) via ctypes.
"""
import ctypes
import math
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
NONE, FULL, LOCAL = 0, 1, 2
EINVAL = -10001
M64 = (1 << 64) - 1


def _load_lib():
    build = pathlib.Path(os.environ.get("NPYLOAD_BUILD_DIR", REPO / "build"))
    if not build.is_absolute():
        build = REPO / build
    so = build / "lib" / "libnpyload.so"
    if not so.exists():
        pytest.skip(f"{so} not built (set NPYLOAD_BUILD_DIR)")
    lib = ctypes.CDLL(str(so))
    f = lib.npyload_order_indices
    f.restype = ctypes.c_int64
    f.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_int64, ctypes.c_uint64,
                  ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_int64,
                  ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t,
                  ctypes.c_int64, ctypes.POINTER(ctypes.c_int64),
                  ctypes.c_size_t]
    return lib


@pytest.fixture(scope="module")
def lib():
    return _load_lib()


def order(lib, n, shuffle=NONE, seed=0, epoch=0, rank=0, world=1, drop=0,
          bs=None, file_sizes=None, window=0):
    if bs is None:
        bs = max(n, 1)
    fs = None
    nf = 0
    if file_sizes is not None:
        nf = len(file_sizes)
        fs = (ctypes.c_int64 * max(nf, 1))(*file_sizes)
    f = lib.npyload_order_indices
    need = f(n, shuffle, seed, epoch, rank, world, drop, bs, fs, nf, window,
             None, 0)
    assert need >= 0, need
    buf = (ctypes.c_int64 * max(need, 1))()
    got = f(n, shuffle, seed, epoch, rank, world, drop, bs, fs, nf, window,
            buf, need)
    assert got == need
    return list(buf[:need])


# ---- independent reimplementation, from the header's text ----------------

def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class Gen:
    G = 0x9E3779B97F4A7C15

    def __init__(self, seed, epoch):
        x = seed & M64
        x = (x + self.G) & M64
        k = _mix64(x)
        x = k ^ epoch
        s = []
        for _ in range(4):
            x = (x + self.G) & M64
            s.append(_mix64(x))
        self.s = s

    @staticmethod
    def _rotl(v, k):
        return ((v << k) | (v >> (64 - k))) & M64

    def draw(self):
        s = self.s
        r = (self._rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = self._rotl(s[3], 45)
        return r

    def bounded(self, b):
        m = self.draw() * b
        lo = m & M64
        if lo < b:
            thr = ((1 << 64) - b) % b
            while lo < thr:
                m = self.draw() * b
                lo = m & M64
        return m >> 64

    def fisher_yates(self, a, lo=0, hi=None):
        hi = len(a) if hi is None else hi
        for i in range(hi - lo - 1, 0, -1):
            j = self.bounded(i + 1)
            a[lo + i], a[lo + j] = a[lo + j], a[lo + i]


def ref_perm(n, shuffle, seed, epoch, file_sizes=None, window=0):
    if shuffle == NONE:
        return list(range(n))
    g = Gen(seed, epoch)
    if shuffle == FULL:
        a = list(range(n))
        g.fisher_yates(a)
        return a
    w = window if window > 0 else 8
    starts = [sum(file_sizes[:f]) for f in range(len(file_sizes))]
    files = list(range(len(file_sizes)))
    g.fisher_yates(files)
    out = []
    for w0 in range(0, len(files), w):
        seg = len(out)
        for f in files[w0:w0 + w]:
            out.extend(range(starts[f], starts[f] + file_sizes[f]))
        g.fisher_yates(out, seg, len(out))
    return out


def ref_rank(seq, world, rank, drop, bs):
    """DistributedSampler on an already-ordered sequence, then batches."""
    n = len(seq)
    if drop and n % world:
        num = math.ceil((n - world) / world)
    else:
        num = math.ceil(n / world)
    total = num * world
    idx = list(seq)
    if not drop:
        pad = total - n
        if pad <= n:
            idx += idx[:pad]
        else:
            idx += (idx * math.ceil(pad / n))[:pad]
    else:
        idx = idx[:total]
    mine = idx[rank:total:world]
    if drop:
        mine = mine[:len(mine) - len(mine) % bs]
    return mine


# ---- tests ----------------------------------------------------------------

CASES = [(n, seed, epoch)
         for n in (0, 1, 2, 3, 7, 10, 64, 100, 1000, 4097)
         for seed in (0, 1, -1, 42, 2**63 - 1, -2**63)
         for epoch in (0, 1, 7, 2**64 - 1)]


@pytest.mark.parametrize("n,seed,epoch", CASES)
def test_full_matches_reference(lib, n, seed, epoch):
    assert order(lib, n, FULL, seed, epoch) == ref_perm(n, FULL, seed, epoch)


def test_known_answer(lib):
    # The same vector test_order.c pins (kat_full_10_seed42_epoch3).
    exp = ref_perm(10, FULL, 42, 3)
    assert order(lib, 10, FULL, 42, 3) == exp
    assert sorted(exp) == list(range(10))


@pytest.mark.parametrize("sizes,window", [
    ([64] * 20, 0), ([64] * 20, 3), ([5, 0, 7, 1, 64, 3, 2], 2),
    ([1] * 300, 8), ([3, 1, 4, 1, 5, 9, 2, 6], 1), ([10] * 9, 100),
    ([0], 0), ([], 0)])
@pytest.mark.parametrize("seed,epoch", [(0, 0), (5, 2), (-9, 11)])
def test_local_matches_reference(lib, sizes, window, seed, epoch):
    n = sum(sizes)
    got = order(lib, n, LOCAL, seed, epoch, file_sizes=sizes, window=window)
    assert got == ref_perm(n, LOCAL, seed, epoch, sizes, window)
    assert sorted(got) == list(range(n))


def test_bad_args(lib):
    f = lib.npyload_order_indices
    buf = (ctypes.c_int64 * 4)()
    assert f(4, NONE, 0, 0, 0, 0, 0, 1, None, 0, 0, buf, 4) == EINVAL
    assert f(4, NONE, 0, 0, 2, 2, 0, 1, None, 0, 0, buf, 4) == EINVAL
    assert f(4, NONE, 0, 0, 0, 1, 0, 0, None, 0, 0, buf, 4) == EINVAL
    assert f(-1, NONE, 0, 0, 0, 1, 0, 1, None, 0, 0, buf, 4) == EINVAL
    assert f(4, 9, 0, 0, 0, 1, 0, 1, None, 0, 0, buf, 4) == EINVAL
    assert f(4, LOCAL, 0, 0, 0, 1, 0, 1, None, 0, 0, buf, 4) == EINVAL
    sizes = (ctypes.c_int64 * 2)(1, 2)
    assert f(4, LOCAL, 0, 0, 0, 1, 0, 1, sizes, 2, 0, buf, 4) == EINVAL
    # cap smaller than the length: the length comes back, cap entries written
    assert f(4, NONE, 0, 0, 0, 1, 0, 1, None, 0, 0, buf, 2) == 4
    assert list(buf[:2]) == [0, 1]


NS = [0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 64, 100, 127, 1000]


def _sampler(n, world, rank, drop):
    from torch.utils.data import DistributedSampler
    return list(DistributedSampler(range(n), num_replicas=world, rank=rank,
                                   shuffle=False, drop_last=drop))


@pytest.mark.parametrize("drop", [0, 1])
@pytest.mark.parametrize("world", range(1, 9))
def test_vs_torch_no_shuffle(lib, world, drop):
    pytest.importorskip("torch", reason="torch not installed; CI installs it")
    for n in NS:
        for bs in (1, 3, 64, 10**6):
            nb = set()
            for r in range(world):
                exp = _sampler(n, world, r, bool(drop))
                if drop:
                    exp = exp[:len(exp) - len(exp) % bs]
                got = order(lib, n, NONE, rank=r, world=world, drop=drop,
                            bs=bs)
                assert got == exp, (n, world, r, drop, bs)
                assert got == ref_rank(list(range(n)), world, r, drop, bs)
                nb.add(math.ceil(len(got) / bs))
            assert len(nb) == 1, (n, world, drop, bs, nb)


@pytest.mark.parametrize("drop", [0, 1])
@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("mode", [FULL, LOCAL])
def test_vs_torch_shuffle(lib, world, drop, mode):
    pytest.importorskip("torch", reason="torch not installed; CI installs it")
    for n in NS:
        sizes = None
        if mode == LOCAL:
            sizes = [4] * (n // 4) + ([n % 4] if n % 4 else [])
        for seed, epoch in ((0, 0), (123, 4)):
            perm = order(lib, n, mode, seed, epoch, file_sizes=sizes,
                         window=2)
            assert sorted(perm) == list(range(n))
            for bs in (1, 4, 10**6):
                for r in range(world):
                    exp = [perm[i] for i in _sampler(n, world, r, bool(drop))]
                    if drop:
                        exp = exp[:len(exp) - len(exp) % bs]
                    got = order(lib, n, mode, seed, epoch, rank=r,
                                world=world, drop=drop, bs=bs,
                                file_sizes=sizes, window=2)
                    assert got == exp, (mode, n, world, r, drop, bs)
