"""dtrain.data from Python: the records C++ deals (`dtrain data list`), a DataLoader whose workers
split a rank's records, an exact resume at another world size, bad records named, and bad
arguments refused."""
import os
import re
import subprocess

import pytest

import harness
import dtrain
import dtrain.data

DTRAIN = os.environ.get("DTRAIN_BIN", os.path.join(harness.HERE, "../../build/bin/dtrain"))
N = 40


@pytest.fixture
def shards(tmp_path):
    """N records holding "rec-000".."rec-039" (one file each) in 3 TFRecord files, written by
    `dtrain data` (a tf.train.Example per file)."""
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(N):
        (folder / f"{i:03d}").write_bytes(b"rec-%03d" % i)
    subprocess.run([DTRAIN, "data", "write", "--from", str(folder), "--format", "tfrecord",
                    "--out", str(tmp_path / "out" / "recs"), "--shards", "3"], check=True,
                   capture_output=True)
    return str(tmp_path / "out" / "recs-*.tfrecord")


def number(record):
    """The N in the "rec-N" the record's Example holds."""
    return int(re.search(rb"rec-(\d{3})", record)[1])


def test_python_takes_the_records_cpp_deals(shards):
    for epoch in (0, 1):
        for rank in range(3):
            data = dtrain.data.ShardedDataset(shards, rank=rank, world_size=3, seed=5)
            data.set_epoch(epoch)
            ids = [r[3] for r in data.records()]
            listed = subprocess.run(
                [DTRAIN, "data", "list", "--rank", str(rank), "--world-size", "3", "--seed", "5",
                 "--epoch", str(epoch), shards], check=True, capture_output=True, text=True)
            assert ids == [int(x) for x in listed.stdout.split()]
            assert len(ids) == len(data) == 14  # ceil(40 / 3)
            # The bytes are the records': record id i of the files in order is "rec-i".
            data.set_epoch(epoch)
            assert [number(b) for b in data] == ids


@pytest.mark.parametrize("launcher", [
    {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
     "OMPI_COMM_WORLD_LOCAL_SIZE": "3"},
    {"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "2", "SLURM_NTASKS_PER_NODE": "3",
     "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "localhost"},
])
def test_the_rank_comes_from_whichever_launcher_started_the_process(shards, launcher):
    # Under mpirun or srun (no RANK, no WORLD_SIZE) a dataset is rank 2 of 3, as dtrain.init() is.
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE") and
           not k.startswith(("OMPI_", "PMI_", "SLURM_"))}
    env.update(launcher)
    code = (f"import dtrain.data; d = dtrain.data.ShardedDataset({shards!r}, seed=5); "
            "print(*[r[3] for r in d.records()])")
    p = subprocess.run([harness.PYTHON, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    listed = subprocess.run([DTRAIN, "data", "list", "--rank", "2", "--world-size", "3",
                             "--seed", "5", shards], check=True, capture_output=True, text=True)
    assert p.stdout.split() == listed.stdout.split(), (p.stdout, listed.stdout)


def test_each_epoch_covers_every_record_once(shards):
    seen = []
    for rank in range(4):
        data = dtrain.data.ShardedDataset(shards, rank=rank, world_size=4, seed=1, decode=number)
        data.set_epoch(3)
        seen += list(data)
    assert sorted(seen) == list(range(N))


def test_dataloader_workers_split_a_ranks_records(shards):
    torch = pytest.importorskip("torch")
    seen = []
    for rank in range(2):
        data = dtrain.data.ShardedDataset(shards, rank=rank, world_size=2, seed=9, decode=number)
        data.set_epoch(1)
        loader = torch.utils.data.DataLoader(data, batch_size=5, num_workers=2)
        batches = [b.tolist() for b in loader]
        assert all(len(b) == 5 for b in batches)
        seen += [i for b in batches for i in b]
    assert sorted(seen) == list(range(N)), "the workers read a record twice or missed one"


def test_a_resumed_epoch_trains_every_record_once_on_fewer_ranks(shards):
    trained, position = [], 0
    for rank in range(4):  # 4 ranks take 6 records each, then stop
        data = dtrain.data.ShardedDataset(shards, rank=rank, world_size=4, seed=2, decode=number)
        data.set_epoch(0)
        it = iter(data)
        trained += [next(it) for _ in range(6)]
        position = data.consumed(6)
    assert position == 24
    for rank in range(3):  # 3 ranks train the other 16: 6 each, the last 2 of them padding
        data = dtrain.data.ShardedDataset(shards, rank=rank, world_size=3, seed=2, decode=number)
        data.set_epoch(0, position)
        trained += list(data)[:len(range(rank, N - position, 3))]
    assert sorted(trained) == list(range(N))


def test_regrouped_survivors_take_the_rest_of_the_epoch_once(shards):
    # Live recovery: 4 ranks take 6 records each and rank 3 dies; the 3 left regroup, go on from
    # the position they agree on, and give the padding no weight.
    datasets = [dtrain.data.ShardedDataset(shards, rank=r, world_size=4, seed=2, decode=number)
                for r in range(4)]
    trained = []
    for data in datasets:
        data.set_epoch(0)
        it = iter(data)
        trained += [next(it) for _ in range(6)]
    position = datasets[0].consumed(6)
    padding = 0
    for rank, data in enumerate(datasets[:3]):
        data.regroup(rank, 3)
        data.set_epoch(0, position)
        fresh = dtrain.data.ShardedDataset(shards, rank=rank, world_size=3, seed=2, decode=number)
        fresh.set_epoch(0, position)
        mine = list(data)
        assert mine == list(fresh)  # what a dataset made for the new world takes
        trained += [x for k, x in enumerate(mine) if not data.is_padding(k)]
        padding += sum(data.is_padding(k) for k in range(len(mine)))
    assert sorted(trained) == list(range(N))
    assert padding == 2  # 16 records over 3 ranks: 6 each, 2 of them again


def test_bad_records_are_named_or_skipped(shards, tmp_path):
    second = str(tmp_path / "out" / "recs-00001-of-00003.tfrecord")
    with open(second, "r+b") as f:  # the data of the file's first record
        f.seek(13)
        f.write(b"#")
    data = dtrain.data.ShardedDataset(shards, shuffle=False, decode=number)
    with pytest.raises(dtrain.InvalidArgumentError) as err:
        list(data)
    assert f"TFRecord file {second}: record 0 at byte 0" in str(err.value)
    assert isinstance(err.value, ValueError)
    skipping = dtrain.data.ShardedDataset(shards, shuffle=False, decode=number,
                                          on_bad_record="skip")
    got = list(skipping)
    assert len(got) == N and 13 not in got and got[13] == 14
    assert len(skipping.skipped) == 1 and "record 0 at byte 0" in skipping.skipped[0]


def test_bad_arguments_are_refused(shards, tmp_path):
    with pytest.raises(dtrain.InvalidArgumentError, match="no file matches"):
        dtrain.data.ShardedDataset(str(tmp_path / "none-*.tfrecord"))
    with pytest.raises(dtrain.InvalidArgumentError, match="use 'fail' or 'skip'"):
        dtrain.data.ShardedDataset(shards, on_bad_record="ignore")
    with pytest.raises(dtrain.InvalidArgumentError, match=r"rank 2 is not in \[0, world_size=2\)"):
        dtrain.data.ShardedDataset(shards, rank=2, world_size=2)
    with pytest.raises(dtrain.InvalidArgumentError, match="positive number of seconds"):
        dtrain.data.ShardedDataset(shards, timeout=float("nan"))


def test_tar_shards_give_webdataset_samples(tmp_path):
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    names = []
    for i in range(6):
        (src / "train" / f"{i:04d}.jpg").write_bytes(b"J" * (100 + i))
        (src / "train" / f"{i:04d}.cls").write_bytes(str(i % 3).encode())
        names += [f"train/{i:04d}.jpg", f"train/{i:04d}.cls"]
    for part, chunk in enumerate((names[:6], names[6:])):
        subprocess.run(["tar", "-cf", str(tmp_path / f"shard-{part}.tar"), "-C", str(src), *chunk],
                       check=True)
    data = dtrain.data.ShardedDataset(str(tmp_path / "shard-*.tar"), shuffle=False)
    samples = list(data)
    assert [s["__key__"] for s in samples] == [f"train/{i:04d}" for i in range(6)]
    assert all(s["jpg"] == b"J" * (100 + i) and s["cls"] == str(i % 3).encode()
               for i, s in enumerate(samples))
    labels = dtrain.data.ShardedDataset(str(tmp_path / "shard-*.tar"), rank=1, world_size=2,
                                        seed=3, decode=lambda s: int(s["cls"]))
    assert len(list(labels)) == 3


def test_a_folder_written_as_tfrecord_is_read_by_tensorflow(tmp_path):
    tf = pytest.importorskip("tensorflow")
    src = tmp_path / "in"
    for name, data in {"cat/0001.jpg": b"meow", "cat/0001.json": b"{}", "dog/0002.jpg": b"woof",
                       "dog/x/0003.png": bytes(range(256))}.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    subprocess.run([DTRAIN, "data", "write", "--from", str(src), "--format", "tfrecord", "--out",
                    str(tmp_path / "pets"), "--shards", "2"], check=True, capture_output=True)
    got = []
    for path in sorted(str(p) for p in tmp_path.glob("pets-*.tfrecord")):
        for raw in tf.data.TFRecordDataset(path):
            f = tf.train.Example.FromString(raw.numpy()).features.feature
            got.append({k: (v.bytes_list.value[0] if v.bytes_list.value else v.int64_list.value[0])
                        for k, v in f.items()})
    assert got == [{"key": b"cat/0001", "jpg": b"meow", "json": b"{}", "cls": 0},
                   {"key": b"dog/0002", "jpg": b"woof", "cls": 1},
                   {"key": b"dog/x/0003", "png": bytes(range(256)), "cls": 1}]
    assert (tmp_path / "pets.classes.txt").read_text() == "cat\ndog\n"
