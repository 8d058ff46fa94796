"""The user documentation of npyload.Loader, kept beside its code
(_loader.py sets Loader.__doc__ from it): the parameters, the per-batch
hook, epochs and resume, lazy start, threads, and a running example."""

LOADER = """Batches of NPY fields, read by worker threads into reused slots.

    Parameters
    ----------
    fields : mapping name -> glob string or list of paths
        Paths and globs may be str, bytes or os.PathLike; names that are not
        UTF-8 work as with os.fsencode / os.fsdecode (messages naming such a
        path hold it surrogate-escaped). Each field is the concatenation of its files along the first (sample)
        axis; a glob's matches are sorted lexicographically. All fields must
        hold the same number of samples.
    batch_size : int >= 1
    shuffle : bool or 'full' / 'local' / 'none'
        True = 'full' (a permutation of all samples per epoch, a pure function
        of (seed, epoch)); 'local' permutes files, then samples within windows
        of ``window`` files (for data larger than RAM).
    seed : int
    drop_last : bool
        As DistributedSampler(drop_last) and DataLoader(drop_last) together.
    num_workers : 'auto' (default) or int >= 0
        Worker *threads* (no processes, no copies of the dataset). 'auto':
        the loader's controller adds and removes threads while it runs, so
        that the loop waits less than ``auto_target`` of its time with the
        fewest slots, then the fewest threads (C's NPYLOAD_AUTO). An int:
        exactly that many, no controller (more than the cores the process
        may use warns once). 0: no thread; each batch is read on the
        calling thread inside ``next()`` (for debugging, as DataLoader's
        num_workers=0); same batches.
    prefetch : 'auto' (default), int >= 1 or None (= 'auto')
        Batches read ahead of the one the loop body holds: the loader has
        prefetch + 1 slots (memory = (prefetch + 1) x batch bytes), because a
        ``for b in loader`` loop still holds the previous batch while it asks
        for the next (C's NPYLOAD_OPT_PREFETCH counts those slots:
        prefetch + 1; npyload-bench's column p is that count and its pasted
        python line says prefetch=p-1). 'auto': the controller adds and
        removes slots while the loader runs, within ``memory_budget``.
    memory_budget : int or None
        With 'auto': bytes the slots and the workers' read buffers may take
        at most (None: a quarter of the memory the process may use, cgroup
        limits included).
    auto_target : float
        With 'auto': the share of the loop's time (wait in ``next()`` plus
        the step) the controller lets the loop wait, default 0.02. The
        controller's decisions are in ``auto_history()`` and logged, one
        INFO line each, on the ``npyload`` logger. Ranks of a node
        (torchrun's ``LOCAL_WORLD_SIZE``) divide the process's cores
        between their controllers.
    device : 'cpu', 'cuda', 'cuda:N', an int, or None (= 'cpu')
        'cuda' without an index uses LOCAL_RANK when set (torchrun).
    rank, world_size : int or None
        Default: torch.distributed when initialised, else the RANK and
        WORLD_SIZE environment variables (torchrun), else 0 and 1.
    io : 'auto', 'uring', 'pread' or 'mmap'
    output : 'auto', 'torch' or 'numpy'
        'auto': torch tensors when torch is importable, numpy arrays otherwise.
    copy : bool
        True: yield owned copies and give each slot back immediately.
    window : int >= 1
        Files per window for shuffle='local'.
    direct_io : bool
        O_DIRECT reads (bypass the page cache).
    read_ahead : bool
        True (default): when a batch has work after its reads (.npy.zst
        decode, narrowed codes, host transforms, a device copy), each
        worker thread has its next batch's reads in flight while it does
        that work on the current one (a read thread and a second read
        buffer per worker; README, "Read-ahead inside every worker"); a
        batch delivered as stored has nothing to overlap and is read by its
        worker. With ``num_workers='auto'`` (host mode) the controller
        switches it off while no read blocks (the page cache) and back on
        when reads block; ``stats()["read_ahead_on"]`` says which. False: a
        worker reads a batch when it starts it (less memory: one read
        buffer and one slot per worker).
    align : 'names' or 'none'
        'names' (default): when every field has the same number of files,
        the i-th files of all fields must carry the same number as the last
        run of digits of their names (``train_0007.npy`` pairs with
        ``train_0007_heatmaps.npy``), so misaligned lists fail at start
        naming both files. 'none' turns the check off.
    on_error : 'raise' or 'skip'
        'raise' (default): a failed read (I/O error, truncated, changed or
        replaced file) raises NpyloadError from the iteration, and a file
        already shorter than its header says fails the constructor. 'skip':
        the batch's reads are retried once, then samples that still fail are
        dropped from the batch (it is shorter; ``batch.indices`` lists what it
        holds), never delivered as wrong bytes, and counted in
        ``stats()['samples_skipped']``; nothing is logged. A ``.npy`` already
        shorter than its header says when the loader is built (a failed
        copy) is loaded with the samples its header says: those it lacks
        are skipped and counted in the same way, and the constructor warns
        once (RuntimeWarning) naming the file. An epoch whose reads all fail
        still ends (its batches are empty).
    max_errors : int or None
        With on_error='skip': once more than this many samples were skipped,
        the next failing batch raises anyway.
    pin_memory : bool or None
        None: pin the staging slots when a CUDA device is the output; True:
        pin host slots through CUDA device 0 even for device='cpu' (where
        CUDA is unusable this warns once, as DataLoader does, and the slots
        stay pageable); False: never pin.
    transforms : mapping from field name to Transform, or None
        Conversions done by the loader (see Transform): in the worker
        threads for device='cpu', on the GPU after the copy otherwise.
        With ``sources``, a key naming a source takes a mapping
        ``{field: Transform}``: that source's own, in place of the field's
        for its rows (every source's must deliver the same dtype, shape
        and layout; such a field runs in the host engine).
    as_tuple : bool
        True: each batch is a :class:`BatchTuple`, the fields' tensors in the
        order ``fields`` gave them (``for images, labels in loader``). False
        (default): a :class:`Batch` mapping. Iterating a ``Batch`` itself
        raises TypeError (it would yield the field names).
    transform : callable or None
        A per-batch hook: ``fn(batch)`` runs on a background thread while the
        loop body works on earlier batches, and what it returns is what the
        loop gets, in order. See "Per-batch hook" below.
    transform_workers : int >= 1
        Threads running ``fn`` (default 1); above 1 only with ``transform=``.
        See "Per-batch hook" below.
    remote : mapping or None
        For ``s3://bucket/prefix/*.npy[.zst]`` globs and lists, and
        ``https://`` lists: ``endpoint``, ``region``, ``access_key``,
        ``secret_key``, ``session_token``, ``profile``, ``path_style``
        ('auto', 'path', 'virtual'), ``anonymous`` (unsigned requests),
        ``cache_dir``, ``cache_bytes``, ``cache_block``, ``timeout`` and
        ``connect_timeout`` (seconds per request attempt), ``retries``,
        ``retry_base`` (seconds), ``max_inflight`` (requests in flight per
        reading thread), ``ca_file``, ``proxy``. What it leaves out comes
        from the AWS environment (``AWS_ENDPOINT_URL_S3`` /
        ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
        ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` /
        ``AWS_DEFAULT_REGION``, ``AWS_PROFILE``) and ``~/.aws/config`` and
        ``credentials``, as boto3 reads them. Batches, order, resume,
        transforms and errors are those of local files; reads are ranged
        GETs retried on transient failures, an object that changed since
        start raises naming its URL. With ``cache_dir``, fetched blocks are
        kept on local disk (at most ``cache_bytes``, default 10 GiB) and
        later epochs read them from there; ranks of a node may share it.
        Secrets never appear in messages, ``stats()`` or ``state_dict()``.
    cache_fill : None, True or False
        With remote fields and a ``cache_dir``: a background thread fills
        the cache from the first ``iter()`` on, in large ranged GETs, in
        the order this rank's epoch needs the blocks (then, when shuffling,
        every other block of the dataset), while the epoch reads what has
        arrived; a block the fill is fetching is waited for, never fetched
        twice. None (default): on when the cache keeps all of that (90 %
        of ``cache_bytes``), else off. True: on, filling the part the cache
        keeps. False: off (blocks are fetched as batches need them). A
        failed fill never fails the epoch (reads fetch on demand); its
        progress and error are in ``stats()`` (``fill_*``).
    persistent_workers, in_order : bool, keyword only
        DataLoader's keywords whose meaning carries over, accepted so that a
        ported call runs: workers are threads that live from the first
        ``iter()`` to ``close()`` (always "persistent"), and batches always
        arrive in order. Other DataLoader keywords (``prefetch_factor``,
        ``collate_fn``, ``sampler``, ``worker_init_fn``...) raise a
        TypeError naming the npyload equivalent.
    sources : mapping name -> fields, keyword only
        A mixture (instead of ``fields``): each source's fields, the mapping
        ``fields`` takes; every source has the same field names, per-sample
        shapes and dtypes. ``batch.source`` gives each row's source (an
        index into ``source_names``), ``batch.indices`` its index within
        that source; ``stats()`` counts the rows per source.
    weights : mapping name -> float, keyword only
        Over every source; only ratios count. Default: each source's sample
        count. ``set_weights()`` changes them, exactly from the next batch.
    samples_per_epoch : int, keyword only
        With sources: the positions of one epoch (default: every source's
        samples summed). The order, resume and the digest are in the
        guide's Mixing sources page.

    Notes
    -----
    Per-batch hook (``transform=fn``): one thread per loader calls ``fn`` on
    each batch (a ``Batch`` or ``BatchTuple``) and queues the result; at most
    ``prefetch`` batches are ahead of the loop (queued results and the one
    ``fn`` works on; at least one queued). The loader then has ``prefetch +
    2`` slots (``4`` for prefetch=1): the loop body may hold two batches
    for a moment while ``for`` rebinds its variable. Torch ops
    release the GIL, so augmentation overlaps the training step. An exception
    from ``fn`` reaches the loop as :class:`TransformError` (with ``seq`` and
    ``epoch`` of the batch, the original chained as ``__cause__``) after the
    batches before it; a read error arrives as the NpyloadError it is. The
    thread stops, and the batches it had queued are dropped (their slots
    given back), when the loop ends or breaks (the iterator is freed), on
    ``close()``, ``set_epoch()``, ``load_state_dict()`` or a new
    ``iter(loader)``; stopping waits for a running ``fn`` call to return.
    ``state_dict()`` counts the batches the loop received, not those the
    thread prepared ahead. With a CUDA device, ``fn`` runs with the CUDA
    stream current when ``iter(loader)`` was called.

    ``transform_workers=N`` runs ``fn`` on N threads (threads, not
    processes: it pays where ``fn`` releases the GIL, as torch ops and most
    numpy ops on whole arrays do; pure-Python code runs one thread at a
    time). Results still come out in order, and the bound is the same: at
    most ``prefetch`` batches (2 for prefetch=1) taken from the loader and
    not yet received by the loop, whether being read, in ``fn`` or done and
    waiting for an earlier one, so the slots stay ``prefetch + 2`` and at
    most ``prefetch`` threads are busy at once (with ``prefetch=None`` the
    default is raised to at least ``N + 1``). An exception, ``break`` and
    the calls above behave as with one thread: the batches before a failed
    one are delivered, then its TransformError; stopping waits for every
    running ``fn`` call. ``stats()["hook_ns"]`` is the time in ``fn``
    summed over the threads; the verdict's "hook" rule (``fn`` busy at
    least half the time) is judged on ``hook_ns / N``, the time per thread.

    Randomness that is exact on resume: the batch ``fn`` receives has
    ``rng``, a ``numpy.random.Generator`` (None without numpy) that depends
    only on the loader's seed, the batch's ``epoch`` and ``seq`` and the
    rank, so the same batch gets the same draws for any
    ``transform_workers``, ``num_workers``, backend, and after
    ``load_state_dict`` at the same world size. Bit for bit::

        words = numpy.array([seed % 2**64, epoch, rank, seq], dtype="<u8").view("<u4")
        rng = numpy.random.Generator(numpy.random.PCG64(numpy.random.SeedSequence(words)))

    (each value as two little-endian 32-bit words, so no two tuples share
    an entropy pool; the rank is in so that ranks do not repeat each
    other's draws). ``fn``'s one argument is unchanged: a ``Batch`` (a
    subclass carrying ``rng``) or a ``BatchTuple`` with the attribute.

    Epochs: every ``iter(loader)`` that is not the first since the
    construction, ``set_epoch()`` or ``load_state_dict()`` advances the epoch
    by one, as ``DataLoader(shuffle=True)`` reshuffles on every ``iter()``.
    So the first loop runs epoch 0 and each later loop the next epoch, from
    its first batch, whether the loop before it ran to its end or was left
    early (``break``, ``next(iter(loader))``). ``set_epoch(e)`` makes the
    next ``iter()`` run epoch ``e`` and always wins: calling it before every
    loop, as DistributedSampler wants, gives the same batches as not calling
    it. ``load_state_dict(state)`` makes the next ``iter()`` run the rest of
    the saved epoch, and the loops after it advance from there; a state
    saved once its loop had run out (``state["loop_ended"] == 1``) resumes
    where the saved loader goes on, at the start of the next epoch. A state
    saved after a ``break`` resumes the rest of that epoch, as one saved
    inside the loop does (and as StatefulDataLoader's does): a loop left
    early, a preempted job's, is taken to be interrupted, not finished,
    so that no sample of it is skipped. Right after ``load_state_dict``,
    ``set_epoch`` with the saved epoch keeps the saved position (the usual
    ``for epoch in range(saved, n): set_epoch(epoch)``).
    An epoch's order is a pure function of (seed, epoch), so the batches of
    a loader never depend on how its epochs were chosen.

    Lazy start: the loader starts (worker threads, slots, pinned and device
    memory, io rings) at the first ``iter()``, so a loader built up front
    (a validation set) holds nothing until it is used. The constructor still
    raises what starting would (missing files, bad headers, sample counts
    that differ between fields, misaligned file names, transforms that do
    not fit, an io backend or CUDA device that cannot be used): it starts a
    scratch loader of one row and one slot, with no worker thread, and
    stops it at once, keeping only what it read of the files (headers,
    sizes and identities): the first ``iter()`` starts it for real without
    reading a header again, unless a local file changed in between (then
    the headers are read again, and the change is refused, or skipped with
    ``on_error='skip'``, as at construction). Before the
    first ``iter()``, ``len()``, ``num_samples``, ``field_names``,
    ``num_slots`` (the slots it will have), ``backend`` (the one the check
    chose), ``state_dict()`` and ``load_state_dict()`` work as after it, and
    ``stats()`` counts nothing: every counter is 0, ``num_slots`` and
    ``slot_bytes`` too.

    See the module docstring for the lifetime rule.

    Threads: one call at a time. A loop's ``next()``, ``iter()``,
    ``set_epoch()``, ``load_state_dict()``, ``state_dict()`` and ``close()``
    called while another of them runs on another thread raise RuntimeError
    ("npyload loader is in use: X was called while Y is running") and change
    nothing. ``stats()``, ``len()``, ``backend`` and the attributes may be
    read from any thread at any time, also while a loop waits for a batch
    (with ``transform=``, ``state_dict()`` too).

    Numeric arguments out of range raise ValueError naming the argument, the
    value and the accepted range in these units (the library's limits, asked
    of it): batch_size 1 .. 2**31, num_workers 0 .. 256, prefetch 1 .. 1023
    (1 .. 1022 with ``transform=``), world_size 1 .. 2**24, window 1 ..
    2**31, seed an int64, max_errors 1 .. 2**63-1, rank below world_size.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> import npyload
    >>> d = tempfile.mkdtemp()
    >>> for i in range(2):  # two files per field, 6 samples each
    ...     np.save(os.path.join(d, f"x_{i}.npy"), np.ones((6, 2, 3), np.float32) * i)
    ...     np.save(os.path.join(d, f"y_{i}.npy"), np.arange(6 * i, 6 * i + 6))
    >>> loader = npyload.Loader({"x": os.path.join(d, "x_*.npy"),
    ...                          "y": os.path.join(d, "y_*.npy")},
    ...                         batch_size=4, shuffle=True, seed=0, num_workers=2,
    ...                         output="numpy")
    >>> len(loader), loader.num_samples
    (3, 12)
    >>> for epoch in range(2):
    ...     loader.set_epoch(epoch)
    ...     for batch in loader:
    ...         assert (batch["y"] == batch.indices).all()  # y holds the sample index
    >>> [batch["x"].shape for batch in loader]
    [(4, 2, 3), (4, 2, 3), (4, 2, 3)]
    >>> loader.close()
"""
