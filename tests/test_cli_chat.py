"""`poot run MODEL` without --prompt: on a terminal an interactive chat (driven here through a
pseudo-terminal), from a pipe a prompt read from stdin.

The chat's mechanics run on the fuzzer's tiny Llama (its answers are noise, but fast); the
history's effect on an answer on the real SmolLM2 (slow)."""
from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
import seeds  # noqa: E402

PROMPT = b">>> "


class Terminal:
    """`poot ARGS` on a pseudo-terminal: what it writes, read up to a marker."""

    def __init__(self, *args: str):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:                                   # the child: poot on the pty
            # as a terminal starts it: a test runner's worker may ignore SIGINT (pytest-xdist's
            # do), and an ignored signal stays ignored across exec
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execvp(sys.executable, [sys.executable, "-m", "poot", *args])
        self.seen = b""

    def until(self, marker: bytes, timeout: float = 600) -> str:
        """Everything written up to and including `marker` (from where the last read
        stopped)."""
        end = time.monotonic() + timeout
        while marker not in self.seen:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise TimeoutError(f"no {marker!r} in {self.seen[-2000:]!r}")
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:                                 # the child closed the pty
                chunk = b""
            if not chunk:
                raise EOFError(f"the chat ended before {marker!r}: {self.seen[-2000:]!r}")
            self.seen += chunk
        i = self.seen.index(marker) + len(marker)
        out, self.seen = self.seen[:i], self.seen[i:]
        return out.decode(errors="replace").replace("\r\n", "\n")

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait_reading(self, timeout: float = 60) -> None:
        """Until the child's main thread sleeps waiting for input. CPython's readline draws
        the prompt before it enters select(); a SIGINT landing between the two only sets a
        flag and select() then waits for a key, so a Ctrl-C sent on seeing the prompt can
        race it."""
        task = Path(f"/proc/{self.pid}/task/{self.pid}")
        end, asleep = time.monotonic() + timeout, 0
        while time.monotonic() < end and asleep < 3:
            try:
                wchan = (task / "wchan").read_text()
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                return
            if wchan not in ("", "0"):                      # the kernel names the wait
                asleep = 3 if "poll" in wchan or "select" in wchan else 0
            else:
                asleep = asleep + 1 if state == "S" else 0
            time.sleep(0.05)

    def exit_code(self, timeout: float = 60) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:                                            # keep the pty drained
                if select.select([self.fd], [], [], 0.1)[0]:
                    self.seen += os.read(self.fd, 4096)
            except OSError:
                pass
        os.kill(self.pid, 9)
        raise TimeoutError("the chat did not exit")

    def close(self) -> None:
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(self.fd)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return seeds.tiny_llama_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture
def tiny_chat(tiny):
    t = Terminal("run", str(tiny), "--backend", "reference", "--max-seq", str(seeds.CTX),
                 "--max-tokens", "4", "--quiet")
    yield t
    t.close()


def test_the_chat_answers_each_line_and_leaves_on_bye(tiny_chat):
    t = tiny_chat
    assert "chatting with tiny.gguf on reference" in t.until(PROMPT, timeout=300)
    t.send("the\n")
    first = t.until(PROMPT)
    assert first.startswith("the\n") and first.endswith(">>> ")   # the echo, then the answer
    t.send("/?\n")
    shown = t.until(PROMPT)
    assert "/bye" in shown and "/clear" in shown and "/system" in shown
    t.send("/clear\n")
    assert "the conversation is forgotten" in t.until(PROMPT)
    t.send("/nope\n")
    assert "unknown command /nope" in t.until(PROMPT)
    t.send("in the\n")
    t.until(PROMPT)
    t.send("/bye\n")
    assert t.exit_code() == 0


def test_ctrl_c_at_the_prompt_stays_and_ctrl_d_leaves(tiny_chat):
    t = tiny_chat
    t.until(PROMPT, timeout=300)
    t.wait_reading()
    t.send("\x03")
    assert "Ctrl-D or /bye to leave" in t.until(PROMPT, timeout=120)
    t.send("\x04")
    assert t.exit_code() == 0


def test_the_conversation_keeps_history_and_drops_the_oldest_turns_that_no_longer_fit(tiny):
    from poot.cli.chat import Conversation
    from poot.models.runner import load

    model = load(str(tiny), "reference", max_seq=seeds.CTX)   # a byte-level vocabulary
    conv = Conversation(model, "be")
    conv.turns = [("a", "b")]
    msgs, dropped = conv.fitted("c")
    assert dropped == 0
    assert [(m["role"], m["content"]) for m in msgs] == [
        ("system", "be"), ("user", "a"), ("assistant", "b"), ("user", "c")]
    conv.turns = [("x" * 12, "y" * 12)] * 3 + [("last", "turn")]
    msgs, dropped = conv.fitted("now")
    assert dropped == 3 and conv.turns == [("last", "turn")]
    assert len(model.prompt_ids(msgs)) < seeds.CTX


def test_a_prompt_is_read_from_stdin_when_it_is_not_a_terminal(tiny):
    r = subprocess.run([sys.executable, "-m", "poot", "run", str(tiny), "--backend",
                        "reference", "--max-seq", str(seeds.CTX), "--max-tokens", "3",
                        "--quiet"], input="the in\n", capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("the in") and len(r.stdout) > len("the in\n")


@pytest.mark.slow
def test_the_chat_remembers_the_conversation(smollm2_gguf):
    t = Terminal("run", str(smollm2_gguf), "--max-seq", "256", "--quiet", "--system",
                 "You are a helpful assistant.")
    try:
        t.until(PROMPT, timeout=600)
        t.send("What is the capital of France?\n")
        assert "Paris" in t.until(PROMPT)
        t.send("And of Germany?\n")                # only the history says "capital"
        assert "Berlin" in t.until(PROMPT)
        t.send("/bye\n")
        assert t.exit_code() == 0
    finally:
        t.close()


@pytest.mark.slow
def test_a_run_that_fills_the_context_says_so(smollm2_gguf):
    r = subprocess.run([sys.executable, "-m", "poot", "run", str(smollm2_gguf), "--prompt",
                        "The capital of France is", "--max-tokens", "16", "--max-seq", "8",
                        "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert ("[poot] note: stopped after 3 tokens at the end of the context: the prompt's 5 "
            "tokens and the answer fill --max-seq 8") in r.stderr, r.stderr


# -- a model without a chat template ---------------------------------------------------------
@pytest.fixture(scope="module")
def untemplated(tmp_path_factory) -> Path:
    kvs = [kv for kv in seeds.llama_kvs() if kv[0] != "tokenizer.chat_template"]
    return seeds.tiny_llama_gguf(tmp_path_factory.mktemp("plain") / "plain.gguf", kvs=kvs)


def test_a_model_without_a_chat_template_refuses_to_chat_before_planning(untemplated):
    t = Terminal("run", str(untemplated), "--backend", "reference", "--max-seq",
                 str(seeds.CTX))
    try:
        assert t.exit_code(timeout=300) == 2
        said = t.seen.decode(errors="replace")
    finally:
        t.close()
    assert ("poot: error: plain.gguf has no chat template (tokenizer.chat_template), so it "
            "cannot chat: give --prompt") in said, said
    assert "compiled" not in said and ">>> " not in said, said


@pytest.mark.parametrize("flags, named", [(["--chat"], "--chat"),
                                          (["--system", "be"], "--system")])
def test_chat_flags_without_a_template_are_refused_by_name(untemplated, flags, named):
    r = subprocess.run([sys.executable, "-m", "poot", "run", str(untemplated), "--backend",
                        "reference", "--max-seq", str(seeds.CTX), "--prompt", "the", *flags],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "compiled" not in r.stderr, r.stderr
    assert r.stderr.strip().endswith(f"has no chat template (tokenizer.chat_template): drop "
                                      f"{named} for a plain completion of --prompt"), r.stderr


# -- a prompt with no room left for an answer ------------------------------------------------
def test_a_prompt_past_max_seq_is_refused_by_the_flag_before_planning(tiny):
    r = subprocess.run([sys.executable, "-m", "poot", "run", str(tiny), "--backend",
                        "reference", "--max-seq", "8", "--prompt", "the in " * 8],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "compiled" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    n = int(re.fullmatch(r"poot: error: the prompt has (\d+) tokens, and --max-seq 8 leaves no "
                         r"room for an answer: give --max-seq (\d+) or more", last)[1])
    assert n >= 8 and last.endswith(f"--max-seq {n + 1} or more"), last


def test_a_chat_message_past_max_seq_is_refused_and_the_chat_goes_on(tiny):
    t = Terminal("run", str(tiny), "--backend", "reference", "--max-seq", "40",
                 "--max-tokens", "2", "--quiet")
    try:
        t.until(PROMPT, timeout=300)
        t.send("the " * 20 + "\n")
        said = t.until(PROMPT)
        assert "poot: error: the prompt has" in said and "--max-seq 40 leaves no room" in said
        t.send("/bye\n")
        assert t.exit_code() == 0
    finally:
        t.close()


# -- a plain prompt that an instruct model answers with nothing -----------------------------
NOTE = "[poot] note: the model ended its answer before any text"


@pytest.mark.slow
def test_an_answer_that_ends_before_any_text_points_to_the_chat_template(smollm2_gguf):
    # --max-seq 8: the plans (and kernel libraries) of the context-end test above
    r = subprocess.run([sys.executable, "-m", "poot", "run", str(smollm2_gguf), "--prompt",
                        "Why is the sky blue?", "--max-seq", "8", "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "Why is the sky blue?\n"       # SmolLM2-Instruct's first token: EOS
    assert NOTE in r.stderr and "add --chat" in r.stderr, r.stderr


@pytest.mark.parametrize("text, chat, finish, template, noted", [
    ("", False, "stop", "{{ x }}", True),
    ("  \n", False, "stop", "{{ x }}", True),
    ("Paris", False, "stop", "{{ x }}", False),     # there is an answer
    ("", True, "stop", "{{ x }}", False),           # it went through the template already
    ("", False, "length", "{{ x }}", False),        # cut, not ended
    ("", False, "stop", None, False),               # a base model: nothing to point to
])
def test_the_empty_answer_note_only_where_the_template_would_help(capsys, text, chat,
                                                                  finish, template, noted):
    from types import SimpleNamespace

    from poot.cli.generating import empty_answer_note

    model = SimpleNamespace(stats=SimpleNamespace(finish_reason=finish),
                            tokenizer=SimpleNamespace(chat_template=template))
    empty_answer_note(model, text, chat)
    assert (NOTE in capsys.readouterr().err) == noted
