"""A job's filesystem view and environment (workers/agent/sandbox.py, the shim's --view, JobRunner.environment),
with the real shim and a real uid switch: no cluster, a second or two each. They need root (to switch users and
mount); they skip otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path, PurePosixPath

import pytest

from workers.agent.runner import CODE_ROOT, JobProcess, JobRunner, RunAs
from workers.agent.sandbox import ViewError, plan_view
from workers.protocol import Dispatch

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users and mounting need root")
JOB_UID = 3_920_001
PROBE = textwrap.dedent("""
    import json, os, sys
    def attempt(path):
        try:
            if os.path.isdir(path):
                return "listed"
            with open(path) as handle:
                return "read " + handle.read()
        except OSError as exc:
            return type(exc).__name__
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    print(json.dumps({"uid": os.getuid(), "paths": {p: attempt(p) for p in sys.argv[1:]},
                      "no_new_privs": status["NoNewPrivs"].strip(), "pid1_visible": os.path.exists("/proc/1/cmdline"),
                      "tmp": sorted(os.listdir("/tmp"))}))
""")


@pytest.fixture
def layout(tmp_path):
    """A host as `make run` lays it out, in a private (0700) folder: state, work dir, artifacts, a token."""
    top = tmp_path / "private-home"  # like /root: no other user may traverse it
    top.mkdir(mode=0o700)
    var = top / "clone" / "var"
    home = var / "agent" / "local" / "job-1" / "attempt-1" / "work-x"
    outputs = var / "artifacts" / "1" / "outputs"
    other = var / "artifacts" / "2" / "outputs"
    for folder in (home, outputs, other):
        folder.mkdir(parents=True)
    for folder in (home, outputs):
        os.chown(folder, JOB_UID, JOB_UID)
    (var / "db.sqlite3").write_text("the console's database")
    (other / "secret.txt").write_text("team blue's secret")
    token = top / "clone" / "agent-token"  # in the checkout the job sees: only the mask keeps it out
    token.write_text("the host token")
    (Path("/tmp") / f"sandbox-test-{os.getpid()}").write_text("another job's temporary file")
    yield {"top": top, "var": var, "home": home, "outputs": outputs, "other": other, "token": token}
    (Path("/tmp") / f"sandbox-test-{os.getpid()}").unlink(missing_ok=True)


def run_in_view(layout, *paths: Path) -> dict:
    user = RunAs.job_user(JOB_UID, None)
    view = plan_view(writable=[layout["home"], layout["outputs"]],
                     # The checkout itself, as where `make run` runs from a clone under a 0700 home.
                     readable=[Path(sys.prefix), Path(sys.base_prefix), CODE_ROOT, layout["top"] / "clone"],
                     private=[layout["var"]], mask=[layout["token"]], can_search=user.can_search)
    view_file = layout["top"].parent / "view.json"
    view_file.write_text(view.to_json())
    result = subprocess.run(
        [sys.executable, "-m", "workers.agent.shim", *user.shim_options(), "--view", str(view_file), "--",
         sys.executable, "-c", PROBE, *map(str, paths)],
        cwd=layout["home"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_job_reaches_its_own_folders_and_the_python_it_needs_and_nothing_else(layout):
    found = run_in_view(layout, layout["home"], layout["outputs"], layout["var"] / "db.sqlite3",
                        layout["other"] / "secret.txt", layout["token"], layout["var"],
                        Path("/tmp") / f"sandbox-test-{os.getpid()}")
    assert found["uid"] == JOB_UID  # and its Python ran, from a virtual environment under a 0700 folder
    paths = found["paths"]
    assert paths[str(layout["home"])] == "listed" and paths[str(layout["outputs"])] == "listed"
    assert paths[str(layout["var"] / "db.sqlite3")] == "FileNotFoundError"
    assert paths[str(layout["other"] / "secret.txt")] == "FileNotFoundError"
    assert paths[str(layout["token"])] == "read "  # /dev/null in its place
    assert paths[str(layout["var"])] == "listed" or paths[str(layout["var"])] == "PermissionError"
    assert paths[f"/tmp/sandbox-test-{os.getpid()}"] == "FileNotFoundError"
    # A private /tmp: at most the way to its own folders (pytest's, under TMPDIR when that is in /tmp).
    way = Path(tempfile.gettempdir()).relative_to("/tmp").parts[:1] if tempfile.gettempdir().startswith("/tmp/") else ()
    assert found["tmp"] in ([], ["pytest-of-root"], list(way))
    # No program it runs gains privileges; it sees no process but its own.
    assert found["no_new_privs"] == "1" and found["pid1_visible"] is False


@pytest.fixture
def volume_folder():
    """A host folder under /mnt holding another team's data: a volume's target is made inside it, in the view."""
    folder = Path("/mnt") / f"console-sandbox-{os.getpid()}"
    folder.mkdir(parents=True)
    (folder / "other-team.txt").write_text("team blue's data")
    yield folder
    (folder / "other-team.txt").unlink()
    folder.rmdir()


def run_with_volumes(layout, binds, script: str) -> subprocess.CompletedProcess:
    user = RunAs.job_user(JOB_UID, None)
    view = plan_view(writable=[layout["home"]], readable=[Path(sys.prefix), Path(sys.base_prefix), CODE_ROOT],
                     private=[layout["var"]], mask=[], can_search=user.can_search, binds=binds)
    view_file = layout["top"].parent / "view.json"
    view_file.write_text(view.to_json())
    return subprocess.run([sys.executable, "-m", "workers.agent.shim", *user.shim_options(), "--view",
                           str(view_file), "--", sys.executable, "-c", script],
                          cwd=layout["home"], capture_output=True, text=True, timeout=60)


def test_a_volume_is_bound_at_its_target_read_only_and_the_hosts_folder_there_is_covered(layout, volume_folder):
    dataset = layout["top"] / "datasets" / "imagenet"  # under a 0700 folder: bound, not reached by its path
    (dataset / "nested").mkdir(parents=True)
    (dataset / "labels.txt").write_text("cat dog")
    for folder in (dataset, dataset / "nested"):
        folder.chmod(0o755)
    (dataset / "labels.txt").chmod(0o644)
    target = volume_folder / "data"  # not on the host: made in the view
    found = run_in_probe(layout, [(dataset, PurePosixPath(target), True)], target / "labels.txt", target,
                         volume_folder / "other-team.txt", volume_folder)
    paths = found["paths"]
    assert paths[str(target / "labels.txt")] == "read cat dog" and paths[str(target)] == "listed"
    assert paths[str(volume_folder / "other-team.txt")] == "FileNotFoundError"  # covered, with the rest of it
    listed = run_with_volumes(layout, [(dataset, PurePosixPath(target), True)],
                              f"import os; print(os.listdir({str(volume_folder)!r}))")
    assert listed.stdout.strip() == "['data']", listed  # the job lists its own volumes there, nothing else
    assert not target.exists()  # the mount point was made in the view's tmpfs, not on the host
    written = run_with_volumes(layout, [(dataset, PurePosixPath(target), True)], textwrap.dedent(f"""
        import errno
        for path in ({str(target / "new.txt")!r}, {str(target / "nested" / "new.txt")!r}):
            try:
                open(path, "w")
            except OSError as exc:
                print(errno.errorcode[exc.errno])
    """))
    assert written.returncode == 0, written.stderr
    assert written.stdout.split() == ["EROFS", "EROFS"]  # read-only all the way down


def test_a_writable_volume_takes_what_the_job_writes(layout, volume_folder):
    scratch = layout["top"] / "scratch"
    scratch.mkdir()
    os.chown(scratch, JOB_UID, JOB_UID)
    target = volume_folder / "scratch"
    result = run_with_volumes(layout, [(scratch, PurePosixPath(target), False)],
                              f"open({str(target / 'out.txt')!r}, 'w').write('kept')")
    assert result.returncode == 0, result.stderr
    assert (scratch / "out.txt").read_text() == "kept"


def test_a_volume_whose_source_was_swapped_for_a_link_after_the_check_is_not_bound(layout, volume_folder):
    shared = layout["top"] / "shared"
    (shared / "data").mkdir(parents=True)
    secret = layout["top"] / "another-teams-data"
    secret.mkdir()
    (secret / "weights.txt").write_text("not yours")
    user = RunAs.job_user(JOB_UID, None)
    view = plan_view(writable=[layout["home"]], readable=[Path(sys.prefix), Path(sys.base_prefix), CODE_ROOT],
                     private=[], mask=[], can_search=user.can_search,
                     binds=[(shared / "data", PurePosixPath(volume_folder / "data"), True)])
    (shared / "data").rename(shared / "was-data")  # a job that could write in `shared` swaps the folder ...
    (shared / "data").symlink_to(secret)  # ... for a link, between the agent's check and the job's start
    view_file = layout["top"].parent / "view.json"
    view_file.write_text(view.to_json())
    result = subprocess.run([sys.executable, "-m", "workers.agent.shim", *user.shim_options(), "--view",
                             str(view_file), "--", "cat", str(volume_folder / "data" / "weights.txt")],
                            cwd=layout["home"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 126 and "changed since the agent checked it" in result.stderr, result
    assert "not yours" not in result.stdout


def test_the_agents_python_is_read_only_to_the_job_even_where_the_host_lets_anyone_write_it(layout):
    """The shim runs the agent's Python as root: a job that could write a module there (a virtual environment owned
    by the --run-as user, say) would run its code as root at the next job's start."""
    venv = Path("/var/tmp") / f"console-sandbox-venv-{os.getpid()}"  # outside any folder the view covers
    (venv / "site-packages").mkdir(parents=True)
    for folder in (venv, venv / "site-packages"):
        folder.chmod(0o777)
    try:
        user = RunAs.job_user(JOB_UID, None)
        view = plan_view(writable=[layout["home"]], readable=[Path(sys.prefix), Path(sys.base_prefix), CODE_ROOT, venv],
                         private=[layout["var"]], mask=[], can_search=user.can_search)
        view_file = layout["top"].parent / "view.json"
        view_file.write_text(view.to_json())
        planted = venv / "site-packages" / "sitecustomize.py"
        result = subprocess.run([sys.executable, "-m", "workers.agent.shim", *user.shim_options(), "--view",
                                 str(view_file), "--", sys.executable, "-c", textwrap.dedent(f"""
                                     import errno
                                     try:
                                         open({str(planted)!r}, "w").write("import os; os.system('id')")
                                     except OSError as exc:
                                         print(errno.errorcode[exc.errno])
                                 """)], cwd=layout["home"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["EROFS"] and not planted.exists()
    finally:
        for path in sorted(venv.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        venv.rmdir()


def test_a_volume_whose_mount_point_a_job_could_redirect_is_refused(layout, volume_folder, tmp_path):
    """The folder a volume's mount point is made in is reached by its path when the job starts: one that another
    job could rename or replace with a link (its holder writable by jobs) would redirect the mount point."""
    user = RunAs.job_user(JOB_UID, None)
    inner = volume_folder / "inner"
    inner.mkdir()
    try:
        def plan():
            return plan_view(writable=[layout["home"]], readable=[], private=[], mask=[],
                             can_search=user.can_search, binds=[(tmp_path, PurePosixPath(inner / "data"), True)],
                             runs_jobs_as=lambda uid: uid == JOB_UID)
        assert plan().binds  # /mnt and its folder: root's
        volume_folder.chmod(0o777)
        with pytest.raises(ViewError, match=f"jobs could write in the folder holding {inner}"):
            plan()
        volume_folder.chmod(0o1777)  # sticky: only the owner of `inner` (root) may rename it
        assert plan().binds
        os.chown(inner, JOB_UID, JOB_UID)
        with pytest.raises(ViewError, match="jobs could write in"):
            plan()
    finally:
        volume_folder.chmod(0o755)
        inner.rmdir()


def test_volumes_one_inside_the_other_or_below_a_file_are_refused(layout, volume_folder, tmp_path):
    user = RunAs.job_user(JOB_UID, None)
    for binds, why in (
            ([(tmp_path, PurePosixPath(volume_folder / "a")), (tmp_path, PurePosixPath(volume_folder / "a" / "b"))],
             "one inside the other"),
            ([(tmp_path, PurePosixPath(volume_folder / "other-team.txt" / "x"))], "is no folder")):
        with pytest.raises(ViewError, match=why):
            plan_view(writable=[layout["home"]], readable=[], private=[], mask=[], can_search=user.can_search,
                      binds=[(source, target, True) for source, target in binds])


def test_a_volume_in_the_way_of_the_jobs_own_folders_is_refused(layout, tmp_path):
    user = RunAs.job_user(JOB_UID, None)
    for target, why in ((layout["home"] / "data", "in the way of"), (layout["home"].parent, "in the way of"),
                        (Path("/tmp/data"), "in the way of /tmp"),
                        (Path(f"/no-such-folder-{os.getpid()}/data"), "does not exist on this host")):
        with pytest.raises(ViewError, match=why):
            plan_view(writable=[layout["home"]], readable=[], private=[], mask=[], can_search=user.can_search,
                      binds=[(tmp_path, PurePosixPath(target), True)])


def run_in_probe(layout, binds, *paths: Path) -> dict:
    result = run_with_volumes(layout, binds, "import sys\n" + PROBE.replace("sys.argv[1:]", repr(list(map(str, paths)))))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_what_the_job_writes_in_its_view_lands_in_its_real_folders(layout):
    user = RunAs.job_user(JOB_UID, None)
    view = plan_view(writable=[layout["home"], layout["outputs"]], readable=[Path(sys.prefix), Path(sys.base_prefix)],
                     private=[layout["var"]], mask=[], can_search=user.can_search)
    view_file = layout["top"].parent / "view.json"
    view_file.write_text(view.to_json())
    target = layout["outputs"] / "model.txt"
    result = subprocess.run([sys.executable, "-m", "workers.agent.shim", *user.shim_options(), "--view",
                             str(view_file), "--", sys.executable, "-c",
                             f"open({str(target)!r}, 'w').write('weights')"],
                            cwd=layout["home"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert target.read_text() == "weights" and target.stat().st_uid == JOB_UID


def test_a_command_the_view_hides_fails_saying_so(layout):
    """A command the host has in a private folder (pyenv's shims under /root, say) and a script whose interpreter
    the view hides: exit 127, and the log says which, not a bare "No such file or directory"."""
    user = RunAs.job_user(JOB_UID, None)
    tools = layout["top"] / "bin"  # under the 0700 folder, outside the job's view
    tools.mkdir()
    (tools / "pyenv-python").write_text("#!/bin/sh\necho host python\n")
    (tools / "pyenv-python").chmod(0o755)
    script = layout["home"] / "train.sh"  # in the job's own folder, naming an interpreter it cannot see
    script.write_text(f"#!{tools / 'pyenv-python'}\nprint('hi')\n")
    script.chmod(0o755)
    os.chown(script, JOB_UID, JOB_UID)
    view = plan_view(writable=[layout["home"]], readable=[Path(sys.prefix), Path(sys.base_prefix), CODE_ROOT],
                     private=[layout["var"]], mask=[], can_search=user.can_search)
    view_file = layout["top"].parent / "view.json"
    view_file.write_text(view.to_json())
    shim = [sys.executable, "-m", "workers.agent.shim", *user.shim_options(), "--view", str(view_file), "--"]
    env = {**os.environ, "PATH": f"{tools}:/usr/bin:/bin"}
    hidden = subprocess.run([*shim, "pyenv-python", "-c", "1"], cwd=layout["home"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert hidden.returncode == 127
    assert f"pyenv-python: command not found on the job's PATH ({tools}:/usr/bin:/bin)" in hidden.stderr
    orphan = subprocess.run([*shim, "./train.sh"], cwd=layout["home"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert orphan.returncode == 127
    assert f"./train.sh is a script whose interpreter {tools / 'pyenv-python'} is not in the job's view" in orphan.stderr


def test_a_view_that_cannot_be_built_stops_the_job_with_the_reason(layout, tmp_path):
    bad = tmp_path / "bad-view.json"
    bad.write_text(json.dumps({"hide": [str(tmp_path / "no-such-folder" / "x")]}))
    result = subprocess.run([sys.executable, "-m", "workers.agent.shim", "--view", str(bad), "--", "true"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 126 and "could not start the job: " in result.stderr and "mount" in result.stderr


def test_a_job_inherits_only_the_allow_listed_environment(tmp_path, monkeypatch):
    for name, value in {"GPU_AGENT_TOKEN": "host-secret", "CONSOLE_ADMIN_PASSWORD": "admin-secret",
                        "DATABASE_URL": "postgres://u:p@db/x", "CELERY_BROKER_URL": "redis://:pw@r/1",
                        "DJANGO_SECRET_KEY": "k" * 50, "AWS_SECRET_ACCESS_KEY": "s3", "CONSOLE_VAR_DIR": "/x",
                        "NCCL_SOCKET_IFNAME": "eth0", "LANG": "C.UTF-8", "EXTRA_FOR_JOBS": "yes"}.items():
        monkeypatch.setenv(name, value)
    runner = JobRunner(None, work_root=tmp_path / "work", artifacts_root=tmp_path / "artifacts",  # type: ignore[arg-type]
                       pass_env=("EXTRA_FOR_JOBS",), console_url="http://console:8000")
    dispatch = Dispatch(job_id=7, attempt=2, host="h", gpu_indices=(0,), kind="train", preset="baseline-fp32",
                        workload={"command": ["true"]}, time_limit_s=60, job_token="the-attempts-token")
    env = runner.environment(JobProcess(dispatch, tmp_path / "work" / "job-7" / "attempt-2"))
    secrets = {"host-secret", "admin-secret", "postgres://u:p@db/x", "redis://:pw@r/1", "k" * 50, "s3", "/x"}
    assert not secrets & set(env.values()), env
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["LANG"] == "C.UTF-8" and env["EXTRA_FOR_JOBS"] == "yes"
    assert env["CONSOLE_JOB_TOKEN"] == "the-attempts-token"
    assert env["CONSOLE_API_URL"] == "http://console:8000/api/v1/job/"


# The agent's view of a job (JobRunner.view) on a host laid out so that Unix modes alone would let the job in: a
# /dev with four GPUs' nodes, and under a world-readable /srv the agent's work root, the artifact store, a
# `--private` folder and a token file, all readable by anyone. Built in a mount namespace of its own (this machine
# has no GPU; the host's /dev and /srv are untouched), and the job, given GPU 1, run in it by the shim.
EXPOSED_HOST = textwrap.dedent("""
    import ctypes, json, os, stat, subprocess, sys
    from pathlib import Path, PurePosixPath
    from workers.agent.runner import JobProcess, JobRunner, RunAs
    from workers.protocol import Dispatch
    libc = ctypes.CDLL(None, use_errno=True)
    for rc in (libc.unshare(0x00020000),  # CLONE_NEWNS; MS_REC | MS_PRIVATE on /; then a /dev and /srv of our own
               libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None),
               libc.mount(b"tmpfs", b"/dev", b"tmpfs", 0, b"mode=0755"),
               libc.mount(b"tmpfs", b"/srv", b"tmpfs", 0, b"mode=0755")):
        if rc != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    for name, major, minor in [("null", 1, 3), ("zero", 1, 5), ("urandom", 1, 9),
                               *((f"nvidia{n}", 195, n) for n in range(4))]:
        os.mknod(f"/dev/{name}", stat.S_IFCHR | 0o666, os.makedev(major, minor))
    uid, probe, srv = int(sys.argv[1]), sys.argv[2], Path("/srv")
    for name, text in {"private/broker.txt": "the broker's password", "artifacts/2/outputs/secret.txt": "team blue's",
                       "agent-token": "the host token"}.items():
        (srv / name).parent.mkdir(parents=True, exist_ok=True)
        (srv / name).write_text(text)
    runner = JobRunner(None, work_root=srv / "work", artifacts_root=srv / "artifacts",  # type: ignore[arg-type]
                       private_paths=(srv / "private",), mask_paths=(srv / "agent-token",))
    (srv / "work").chmod(0o755)  # as if the agent's own 0700 were lost: the view alone keeps the job out
    (srv / "work" / "other-job.log").write_text("another job's log")
    home = srv / "work" / "job-1" / "attempt-1" / "work-x"
    for folder in (home, srv / "artifacts" / "1" / "checkpoints", srv / "artifacts" / "1" / "outputs"):
        folder.mkdir(parents=True)
        os.chown(folder, uid, uid)
    user = RunAs.job_user(uid, None)
    dispatch = Dispatch(job_id=1, attempt=1, host="h", gpu_indices=(1,), kind="train", preset="baseline-fp32",
                        workload={"command": ["true"]}, time_limit_s=60)
    (srv / "view.json").write_text(runner.view(JobProcess(dispatch, home.parent, home=home, user=user)).to_json())
    paths = ["/srv/private/broker.txt", "/srv/artifacts/2/outputs/secret.txt", "/srv/agent-token",
             "/srv/work/other-job.log"]
    done = subprocess.run([sys.executable, "-m", "workers.agent.shim", *user.shim_options(), "--view",
                           str(srv / "view.json"), "--", sys.executable, "-c", probe, *paths],
                          cwd=home, capture_output=True, text=True, timeout=60)
    sys.stderr.write(done.stderr)
    print(done.stdout, end="")
""")
DEVICES_PROBE = PROBE + textwrap.dedent("""
    print(json.dumps({n: [os.major(s.st_rdev), os.minor(s.st_rdev)] for n in range(4)
                      for s in [os.stat(f"/dev/nvidia{n}")]}))
""")


def test_the_agents_view_hides_its_folders_private_paths_token_and_other_gpus_even_from_a_readable_host():
    result = subprocess.run([sys.executable, "-c", EXPOSED_HOST, str(JOB_UID), DEVICES_PROBE],
                            cwd=CODE_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    found_line, devices_line = result.stdout.splitlines()
    found = json.loads(found_line)
    assert found["uid"] == JOB_UID, found
    paths = found["paths"]
    # The --private folder, the artifact store's other jobs and the agent's work root: covered, not there.
    for path in ("/srv/private/broker.txt", "/srv/artifacts/2/outputs/secret.txt", "/srv/work/other-job.log"):
        assert paths[path] == "FileNotFoundError", (path, paths[path])
    assert paths["/srv/agent-token"] == "read "  # the token file: /dev/null in its place
    # (major, minor) of /dev/nvidiaN as the job sees it: its own GPU's node; /dev/null's (1, 3) for the others'.
    devices = {int(n): tuple(numbers) for n, numbers in json.loads(devices_line).items()}
    assert devices == {0: (1, 3), 1: (195, 1), 2: (1, 3), 3: (1, 3)}, devices


@pytest.fixture
def noexec_folder(layout):
    """A folder on a filesystem mounted noexec (where an admin keeps data, not programs)."""
    folder = layout["top"] / "noexec"
    folder.mkdir(mode=0o755)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec,size=1m,mode=0755", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_volume_from_a_noexec_filesystem_runs_no_program_in_the_job(layout, volume_folder, noexec_folder):
    scratch = layout["top"] / "scratch"  # the same program on an ordinary filesystem: the control
    scratch.mkdir(mode=0o755)
    for folder in (noexec_folder, scratch):
        tool = folder / "tool"
        tool.write_text("#!/bin/sh\necho ran\n")
        tool.chmod(0o755)
        os.chown(folder, JOB_UID, JOB_UID)
    script = textwrap.dedent(f"""
        import subprocess
        for tool in ({str(volume_folder / "data" / "tool")!r}, {str(volume_folder / "scratch" / "tool")!r}):
            try:
                print(subprocess.run([tool], capture_output=True, text=True).stdout.strip())
            except OSError as exc:
                print(type(exc).__name__)
    """)
    # Writable binds: a read-only remount must not be what happens to keep noexec.
    result = run_with_volumes(layout, [(noexec_folder, PurePosixPath(volume_folder / "data"), False),
                                       (scratch, PurePosixPath(volume_folder / "scratch"), False)], script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["PermissionError", "ran"]
