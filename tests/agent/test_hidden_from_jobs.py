"""The agent's start-up hands its runner what every job's view must cover: the host token file, the --private
folders and the filesystem broker's folders (the runner's own test checks that the view covers what it is given)."""

from pathlib import Path

from workers.agent.main import hidden_from_jobs, parse_args


def test_the_token_file_private_folders_and_the_filesystem_broker_are_hidden(tmp_path, monkeypatch):
    monkeypatch.delenv("GPU_AGENT_PRIVATE", raising=False)
    token = tmp_path / "etc" / "agent-token"
    args = parse_args(["--token-file", str(token), "--private", str(tmp_path / "secret"),
                       "--broker", "filesystem://", "--broker-dir", str(tmp_path / "var" / "broker")])

    private, masked = hidden_from_jobs(args)

    assert masked == (token.resolve(),)
    assert tmp_path / "secret" in private
    assert {(tmp_path / "var" / "broker").resolve(), (tmp_path / "var" / "broker-control").resolve()} <= set(private)


def test_a_network_broker_has_no_folders_to_hide(tmp_path):
    args = parse_args(["--broker", "redis://127.0.0.1:6379/1", "--token-file", str(tmp_path / "t")])
    private, masked = hidden_from_jobs(args)
    assert not any("broker" in Path(p).name for p in private)
    assert masked == ((tmp_path / "t").resolve(),)
