# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one command runner (standard library only): every command rigbook runs on a box goes through `run`.

- argv only, never a shell string; LC_ALL=C (and SYSTEMD_PAGER empty) over the caller's environment, so output is
  parsed in one language; ENV adds to it, or replaces it with CLEAN_ENV;
- a timeout: the process is killed and the Result says timed_out, keeping what it printed until then;
- bounded output: at most MAX_OUTPUT bytes of each stream are kept (LINES=(head, tail) keeps the first and last
  lines of a long stdout instead, e.g. a journal);
- a command that cannot start is a Result with rc None and the reason in error, never an exception.

`spawn(ARGV, ...)` starts a long-running child under the same rules and hands back its process (a container, a
detached supervisor, a build whose output is followed line by line): the one place a command is started otherwise.

`recorded_or_live(ROOT, NAME, ARGV)` is the evidence root's reader of a command: run live under "/", read the
recording var/lib/rigbook/commands/NAME.txt under a recorded tree (lab host, snapshot, test fixture).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import threading
import time

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import files

BASE_ENV = {"LC_ALL": "C", "SYSTEMD_PAGER": ""}
MAX_OUTPUT = 32 << 20
COMMANDS_DIR = ("var", "lib", "rigbook", "commands")

Result = collections.namedtuple("Result", "argv rc stdout stderr error timed_out")
# What spawn's STDOUT and STDERR take besides a file: a pipe to read, stderr into stdout, nothing.
PIPE = subprocess.PIPE
STDOUT = subprocess.STDOUT
DEVNULL = subprocess.DEVNULL


def environment(env=None, clean_env=False):
    """The environment a command runs with: BASE_ENV over os.environ (or over nothing with CLEAN_ENV), then ENV."""
    full = {} if clean_env else dict(os.environ)
    full.update(BASE_ENV)
    full.update(env or {})
    return full


def _describe(argv):
    return " ".join(str(a) for a in argv)[:300]


def run(argv, timeout=None, env=None, clean_env=False, cwd=None, data=None, lines=None):
    """Run ARGV; a Result (argv, rc, stdout, stderr, error, timed_out). rc is None when it could not start or was
    killed at TIMEOUT; error says why it did not succeed (None when rc is 0). DATA (bytes or text) is its stdin.
    LINES=(head, tail) keeps only the first HEAD and last TAIL lines of stdout (the count skipped is marked)."""
    argv = [str(a) for a in argv]
    if lines:
        return _run_lines(argv, timeout, environment(env, clean_env), cwd, lines)
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        proc = subprocess.run(argv, input=data, stdin=None if data is not None else subprocess.DEVNULL,
                              capture_output=True, timeout=timeout, env=environment(env, clean_env), cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        return Result(argv, None, _text(exc.stdout), _text(exc.stderr),
                      "%s did not finish in %s s" % (_describe(argv), timeout), True)
    except OSError as exc:
        return Result(argv, None, "", "", "%s: %s" % (_describe(argv), exc.strerror or exc), False)
    out, err = _text(proc.stdout), _text(proc.stderr)
    error = None
    if proc.returncode != 0:
        error = "%s exited %d: %s" % (_describe(argv), proc.returncode, (err or out).strip()[-400:])
    return Result(argv, proc.returncode, out, err, error, False)


def _text(data):
    if data is None:
        return ""
    if isinstance(data, str):
        return data[:MAX_OUTPUT]
    return data[:MAX_OUTPUT].decode("utf-8", "replace")


def _run_lines(argv, timeout, env, cwd, lines):
    head, tail = lines
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, cwd=cwd)
    except OSError as exc:
        return Result(argv, None, "", "", "%s: %s" % (_describe(argv), exc.strerror or exc), False)
    timer = threading.Timer(timeout, proc.kill) if timeout else None
    deadline = time.monotonic() + (timeout or 0)
    if timer:
        timer.start()
    first, last, total = [], collections.deque(maxlen=tail), 0
    try:
        for raw in proc.stdout:
            total += 1
            text = raw.decode("utf-8", "replace")
            if len(first) < head:
                first.append(text)
            else:
                last.append(text)
        stderr = _text(proc.stderr.read())
        code = proc.wait()
    finally:
        if timer:
            timer.cancel()
    skipped = total - len(first) - len(last)
    out = "".join(first) + ("[... %d lines skipped ...]\n" % skipped if skipped else "") + "".join(last)
    timed_out = bool(timeout) and code != 0 and time.monotonic() >= deadline
    if timed_out:
        return Result(argv, None, out, stderr, "%s stopped after %s s" % (argv[0], timeout), True)
    error = None if code == 0 else "%s exited %d: %s" % (_describe(argv), code, stderr.strip()[-300:])
    return Result(argv, code, out, stderr, error, False)


SKIPPED = re.compile(r"^\[\.\.\. (\d+) lines skipped \.\.\.\]$")


def lines_printed(stdout, lines):
    """How many lines the command of a run with LINES=(head, tail) printed: those its STDOUT kept, plus those the
    mark between the first HEAD and the last TAIL says were skipped (a mark is there only with both kept whole)."""
    head, tail = lines
    parts = (stdout or "").split("\n")
    if parts[-1] == "":
        parts.pop()
    skipped = SKIPPED.match(parts[head]) if len(parts) == head + 1 + tail else None
    return len(parts) - 1 + int(skipped.group(1)) if skipped else len(parts)


def spawn(argv, env=None, clean_env=False, cwd=None, stdout=None, stderr=None, text=False, new_session=False):
    """Start ARGV and return its subprocess.Popen, for a child that outlives one call of `run` (its caller waits on
    it, signals it or reads its output as it comes). Argv and environment as `run` (LC_ALL=C over the caller's
    environment, ENV, CLEAN_ENV); stdin is /dev/null. STDOUT, STDERR: a file, PIPE, STDOUT (stderr into stdout),
    DEVNULL, or None to inherit; TEXT reads the pipes as UTF-8 text (undecodable bytes replaced); NEW_SESSION
    detaches it from this process's session. Raises OSError when it cannot start: the caller owns the process."""
    argv = [str(a) for a in argv]
    options = {"encoding": "utf-8", "errors": "replace"} if text else {}
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, cwd=cwd,
                            env=environment(env, clean_env), start_new_session=new_session, **options)


def output(argv, timeout=None, env=None, clean_env=False, cwd=None):
    """(stdout, None) when ARGV succeeded, else (None, why)."""
    result = run(argv, timeout=timeout, env=env, clean_env=clean_env, cwd=cwd)
    return (result.stdout, None) if result.rc == 0 else (None, result.error)


def rc_output(argv, timeout=None, env=None):
    """(rc, stdout) of ARGV: the shape the pure readers take as their RUN (rc -1 when it could not run)."""
    result = run(argv, timeout=timeout, env=env)
    return (-1 if result.rc is None else result.rc), result.stdout


def recording_path(root, name):
    """Where a recorded tree keeps the output of the command named NAME."""
    return files.path(root, *COMMANDS_DIR + (name + ".txt",))


def recorded_or_live(root, name, argv, timeout=60):
    """(text, source) of a command: ARGV run live under "/", the recording of NAME read under a recorded tree.
    text is None when the command is missing, failed, or has no recording; source says which it was."""
    if files.is_live(root):
        result = run(argv, timeout=timeout)
        if result.rc != 0:
            return None, result.error
        return result.stdout, _describe(argv)
    rel = os.path.join(*COMMANDS_DIR + (name + ".txt",))
    text = files.read_text(recording_path(root, name))
    return text, ("recorded " + rel if text is not None else "no recording at " + rel)
