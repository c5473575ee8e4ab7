"""The ``aws`` CLI (awscli from PyPI) against a real server: cp up and down, sync, ls, presign."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from bench.servers import ServerProcess
from tests.s3.conftest import ACCESS_KEY, SECRET_KEY

AWS = str(Path(sys.executable).parent / "aws")
MiB = 1024 * 1024

pytestmark = pytest.mark.slow


def aws(
    server: ServerProcess, *args: str, secret: str = SECRET_KEY, config: str = "/nonexistent/aws-config"
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": config,
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
        "AWS_MAX_ATTEMPTS": "1",
    }
    return subprocess.run(
        [AWS, "--endpoint-url", server.url, *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_cp_up_and_down_with_multipart(s3_server: ServerProcess, bucket: str, tmp_path: Path) -> None:
    data = os.urandom(20 * MiB + 123)  # over the CLI's 8 MiB threshold: a multipart upload and download
    (tmp_path / "big.bin").write_bytes(data)
    up = aws(s3_server, "s3", "cp", str(tmp_path / "big.bin"), f"s3://{bucket}/files/big.bin")
    assert up.returncode == 0, up.stderr
    down = aws(s3_server, "s3", "cp", f"s3://{bucket}/files/big.bin", str(tmp_path / "back.bin"))
    assert down.returncode == 0, down.stderr
    assert (tmp_path / "back.bin").read_bytes() == data


def test_sync_and_ls(s3: Any, s3_server: ServerProcess, bucket: str, tmp_path: Path) -> None:
    local = tmp_path / "tree"
    (local / "sub" / "deeper").mkdir(parents=True)
    files = {"a.txt": b"alpha", "sub/b.txt": b"beta" * 1000, "sub/deeper/c.bin": os.urandom(70_000)}
    for rel, content in files.items():
        (local / rel).write_bytes(content)
    result = aws(s3_server, "s3", "sync", str(local), f"s3://{bucket}/tree")
    assert result.returncode == 0, result.stderr
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="tree/")["Contents"]
    assert sorted(o["Key"] for o in listed) == sorted(f"tree/{rel}" for rel in files)
    again = aws(s3_server, "s3", "sync", str(local), f"s3://{bucket}/tree")
    assert again.returncode == 0 and "upload:" not in again.stdout  # nothing changed, nothing sent
    ls = aws(s3_server, "s3", "ls", f"s3://{bucket}/tree/")
    assert ls.returncode == 0, ls.stderr
    assert "PRE sub/" in ls.stdout and "a.txt" in ls.stdout
    recursive = aws(s3_server, "s3", "ls", "--recursive", f"s3://{bucket}/")
    assert all(f"tree/{rel}" in recursive.stdout for rel in files)
    buckets = aws(s3_server, "s3", "ls")
    assert bucket in buckets.stdout
    moved = aws(s3_server, "s3", "mv", f"s3://{bucket}/tree/a.txt", f"s3://{bucket}/moved/a.txt")
    assert moved.returncode == 0, moved.stderr  # CopyObject, then DeleteObject
    assert s3.get_object(Bucket=bucket, Key="moved/a.txt")["Body"].read() == files["a.txt"]
    back = tmp_path / "back"
    result = aws(s3_server, "s3", "sync", f"s3://{bucket}/tree", str(back))
    assert result.returncode == 0, result.stderr
    for rel, content in files.items():
        if rel != "a.txt":
            assert (back / rel).read_bytes() == content
    assert not (back / "a.txt").exists()


def test_presign_and_wrong_secret(s3: Any, s3_server: ServerProcess, bucket: str, tmp_path: Path) -> None:
    """``aws s3 presign`` writes SigV2 URLs unless the profile asks for s3v4; only SigV4 is served."""
    s3.put_object(Bucket=bucket, Key="p.txt", Body=b"presigned by the cli")
    config = tmp_path / "aws-config"
    config.write_text("[default]\ns3 =\n  signature_version = s3v4\n")
    presign = aws(
        s3_server, "s3", "presign", f"s3://{bucket}/p.txt", "--expires-in", "60", config=str(config)
    )
    assert presign.returncode == 0, presign.stderr
    response = requests.get(presign.stdout.strip(), timeout=30)
    assert response.status_code == 200, response.text
    assert response.content == b"presigned by the cli"
    wrong = aws(s3_server, "s3", "ls", f"s3://{bucket}/", secret="wrong-secret")
    assert wrong.returncode != 0
    assert "SignatureDoesNotMatch" in wrong.stderr


def test_cp_keeps_content_type_and_metadata(
    s3: Any, s3_server: ServerProcess, bucket: str, tmp_path: Path
) -> None:
    (tmp_path / "small.csv").write_bytes(b"a,b\n")
    (tmp_path / "big.bin").write_bytes(os.urandom(9 * MiB))
    for name in ("small.csv", "big.bin"):  # a PutObject, then a multipart upload
        result = aws(
            s3_server, "s3", "cp", str(tmp_path / name), f"s3://{bucket}/{name}",
            "--content-type", "text/csv", "--metadata", "source=cli",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        head = s3.head_object(Bucket=bucket, Key=name)
        assert head["ContentType"] == "text/csv" and head["Metadata"] == {"source": "cli"}
    result = aws(s3_server, "s3api", "get-bucket-versioning", "--bucket", bucket)
    assert result.returncode == 0, result.stderr
    result = aws(s3_server, "s3api", "put-object-tagging", "--bucket", bucket, "--key", "small.csv",
                 "--tagging", "TagSet=[{Key=a,Value=b}]")  # fmt: skip
    assert result.returncode != 0 and "NotImplemented" in result.stderr
    assert s3.get_object(Bucket=bucket, Key="small.csv")["Body"].read() == b"a,b\n"


def test_mb_rm_sync_delete_and_rb(s3: Any, s3_server: ServerProcess, tmp_path: Path) -> None:
    """The bucket commands: mb (and its refusal of a name S3 refuses), rm, sync --delete, rb --force."""
    name = f"cli-{os.urandom(6).hex()}"
    made = aws(s3_server, "s3", "mb", f"s3://{name}")
    assert made.returncode == 0, made.stderr
    assert name in aws(s3_server, "s3", "ls").stdout
    bad = aws(s3_server, "s3", "mb", "s3://cli.-bad")
    assert bad.returncode != 0 and "InvalidBucketName" in bad.stderr
    local = tmp_path / "tree"
    (local / "d").mkdir(parents=True)
    for rel in ("a.txt", "b.txt", "d/c.txt"):
        (local / rel).write_text(rel)
    assert aws(s3_server, "s3", "sync", str(local), f"s3://{name}/t").returncode == 0
    (local / "b.txt").unlink()
    synced = aws(s3_server, "s3", "sync", "--delete", str(local), f"s3://{name}/t")
    assert synced.returncode == 0, synced.stderr
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=name)["Contents"]] == ["t/a.txt", "t/d/c.txt"]
    removed = aws(s3_server, "s3", "rm", "--recursive", f"s3://{name}/t/d")
    assert removed.returncode == 0, removed.stderr
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=name)["Contents"]] == ["t/a.txt"]
    refused = aws(s3_server, "s3", "rb", f"s3://{name}")
    assert refused.returncode != 0 and "BucketNotEmpty" in refused.stderr
    gone = aws(s3_server, "s3", "rb", "--force", f"s3://{name}")
    assert gone.returncode == 0, gone.stderr
    assert name not in aws(s3_server, "s3", "ls").stdout
