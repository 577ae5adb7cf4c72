"""The package as users meet it: documented API, installable into a venv without network."""
import inspect
import os
import pydoc
import subprocess

import kvtier

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_public_name_is_documented():
    missing = []
    for name in kvtier.__all__:
        obj = getattr(kvtier, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            if not inspect.getdoc(obj):
                missing.append(name)
            for mname, m in vars(obj).items() if inspect.isclass(obj) else ():
                if not mname.startswith("_") and callable(m) and not inspect.getdoc(m):
                    missing.append(f"{name}.{mname}")
    assert missing == []


def test_help_of_store_reads_well():
    text = pydoc.render_doc(kvtier.Store, renderer=pydoc.plaintext)
    for needle in ("model_id", "find(self, tokens", "restore(self, hit", "put(self, entry",
                   "Optional[kvtier.entry.Entry]", "longest usable cached prefix"):
        assert needle in text, needle


def test_error_classes_carry_code_and_message(tmp_path):
    try:
        kvtier.read_header(tmp_path / "nope.mlxkv")
    except kvtier.KvtierError as e:
        assert isinstance(e, OSError) and e.code < 0 and "nope.mlxkv" in e.message
    else:
        raise AssertionError("no exception")
    assert issubclass(kvtier.InvalidArgumentError, ValueError)
    assert issubclass(kvtier.TimeoutError, TimeoutError)
    assert kvtier.strerror(kvtier._ext.E_CORRUPT)


def test_pip_installs_into_a_venv_without_network(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    # the library this suite runs against: <build>/python/kvtier/_ext*.so
    build = os.path.dirname(os.path.dirname(os.path.dirname(kvtier._ext.__file__)))
    env = dict(os.environ, KVTIER_BUILD=build, PIP_NO_INDEX="1", PIP_NO_CACHE_DIR="1")
    env.pop("PYTHONPATH", None)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", os.path.join(ROOT, "python")],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    code = ("import kvtier, torch; c = kvtier.KVCache(torch.ones(1, 1, 2, 8), torch.ones(1, 1, 2, 8));"
            "print(kvtier.__file__, c.offset)")
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                       text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    path, offset = r.stdout.split()
    assert path.startswith(str(venv)) and offset == "2"
