"""serve/profile.engine_args: the one place that decides which process starts SGLang's server, and with what.

Command lines as Linux shows them in /proc/PID/cmdline: a console script started through its shebang is
[<interpreter of the shebang>, <the script's path>, its arguments...]; SGLang's console command is `sglang` with the
subcommand `serve` (its entry point sglang.cli.main:main); multiprocessing's spawn workers and its resource tracker
run `python -c ...`; SGLang renames its scheduler processes (sglang::scheduler_TP0).
"""

from __future__ import annotations

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.serve import profile as serve

ARGS = ["--model-path", "/home/kk/models/Qwen3.8-27B-AWQ", "--tp-size", "2", "--mem-fraction-static", "0.88"]
VENV = "/home/kk/venv"


@pytest.mark.parametrize("argv", [
    [f"{VENV}/bin/python3", "-m", "sglang.launch_server", *ARGS],
    ["python3", "-m", "sglang.launch_server", *ARGS],
    [f"{VENV}/bin/python3", f"{VENV}/bin/sglang", "serve", *ARGS],  # `sglang serve` through its shebang
    ["/usr/bin/python3.12", f"{VENV}/bin/sglang", "serve", *ARGS],  # `python3.12 /path/bin/sglang serve`
    [f"{VENV}/bin/python3", "-m", "sglang.cli.main", "serve", *ARGS],
    [f"{VENV}/bin/python", "-u", "-X", "faulthandler", "-W", "ignore", "-m", "sglang.launch_server", *ARGS],
    [f"{VENV}/bin/python3", "-um", "sglang.launch_server", *ARGS],
    [f"{VENV}/bin/python3", "-msglang.cli.main", "serve", *ARGS],
    [f"{VENV}/bin/python3", "-Wignore", "-Xdev", f"{VENV}/bin/sglang", "serve", *ARGS],
    [f"{VENV}/bin/sglang", "serve", *ARGS],  # a launcher that is the command itself
], ids=lambda argv: " ".join(w.rsplit("/", 1)[-1] for w in argv[:4]))
def test_every_way_sglang_is_started_gives_its_own_arguments(argv):
    assert serve.engine_args(argv) == ARGS


@pytest.mark.parametrize("argv", [
    # multiprocessing's children of an engine: a spawned worker, the resource tracker, the forkserver
    [f"{VENV}/bin/python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, "
     "pipe_handle=7)", "--multiprocessing-fork"],
    [f"{VENV}/bin/python3", "-c", "from multiprocessing.resource_tracker import main;main(6)"],
    [f"{VENV}/bin/python3", "-c", "from multiprocessing.forkserver import main; main(8, 9, ['sglang.launch_server'])"],
    ["sglang::scheduler_TP0"], ["sglang::detokenizer"],  # renamed by the engine
    # a shell that runs the engine without exec: its own command line is the shell's
    ["/bin/bash", "/home/kk/start-sglang.sh"], ["bash", "-c", f"{VENV}/bin/sglang serve --model-path /m"],
    ["/bin/sh", "-c", "exec sglang serve --model-path /m"],
    # a tool that starts one as its child, and SGLang's other subcommands
    ["/home/kk/.local/bin/uv", "run", "sglang", "serve", *ARGS],
    [f"{VENV}/bin/python3", f"{VENV}/bin/sglang", "generate", "--model-path", "/m"],
    [f"{VENV}/bin/python3", "-m", "sglang.cli.main", "generate", "--model-path", "/m"],
    [f"{VENV}/bin/python3", f"{VENV}/bin/sglang"], [f"{VENV}/bin/sglang"],
    [f"{VENV}/bin/python3", "/srv/bench/serve.py", "serve", *ARGS],
    [f"{VENV}/bin/python3", "-m", "sglang.bench_serving", "--port", "30000"],
    [f"{VENV}/bin/python3", "-", "-m", "sglang.launch_server"],  # a program on stdin
    [f"{VENV}/bin/python3", "-W"], ["/usr/bin/node", "-m", "sglang.launch_server"],
])
def test_what_starts_no_engine(argv):
    assert serve.engine_args(argv) is None


def test_the_inventorys_engine_command_is_recognised_before_sglangs_own():
    standin = ["/usr/bin/python3", "/var/cache/rigbook/artifacts/sglang-standin.py"]
    argv = ["/opt/v/bin/python3", standin[1], "--model-path", "/m"]
    assert serve.engine_args(argv, standin) == ["--model-path", "/m"]
    assert serve.engine_args([f"{VENV}/bin/python3", f"{VENV}/bin/sglang", "serve", *ARGS], standin) == ARGS
