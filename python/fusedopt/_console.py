"""What the command-line tools (``python -m fusedopt.demo``, ``python -m fusedopt.bench``)
share: TensorFlow imported without its log noise, numbered stages, a progress line on
stderr, and ``--help`` that shows every default. Imports nothing heavy itself."""
import argparse
import contextlib
import os
import re
import shutil
import sys
import tempfile
import time

__all__ = ["ArgumentParser", "HelpFormatter", "Progress", "Stages", "TF_LOG_SETTING",
           "duration", "import_tensorflow", "is_load_noise", "log_level", "stderr_without_load_noise",
           "whole_number"]

TF_LOG_SETTING = "TF_CPP_MIN_LOG_LEVEL"


# What TensorFlow may print while it loads whatever TF_CPP_MIN_LOG_LEVEL says: on CPUs
# where it turns oneDNN on (AVX-512 Xeons), TF 2.21 logs "oneDNN custom operations are on"
# through absl before absl's logging is set up, which prints every level to stderr, headed
# by absl's own notice (a warning).
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# absl's line prefix: level letter, MMDD, a time, thread id, file:line (the time's form
# varies: "00:00:1796680755.304542" when the clock was not set up either).
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+ +\d+ \S+:\d+\] ")
_LEVELS = "IWEF"  # TF_CPP_MIN_LOG_LEVEL's numbering: 0 info, 1 warning, 2 error, 3 fatal


def log_level(value):
    """TF_CPP_MIN_LOG_LEVEL's value as TensorFlow reads it: 0 to 3; anything else 0."""
    try:
        return min(max(int(value), 0), 3)
    except (TypeError, ValueError):
        return 0


def is_load_noise(line, level):
    """Whether TF_CPP_MIN_LOG_LEVEL=`level` hides this line TensorFlow printed while
    loading: an absl line (or absl's notice, a warning) below that level."""
    line = line.rstrip("\n")
    if line == _ABSL_NOTICE:
        return level > _LEVELS.index("W")
    match = _ABSL_LINE.match(line)
    return bool(match) and level > _LEVELS.index(match.group(1))


@contextlib.contextmanager
def stderr_without_load_noise(level):
    """Inside: file descriptor 2 goes to a temporary file; on the way out every line of it
    but is_load_noise's (at `level`) is written to stderr. (C++ code writes to the
    descriptor, so sys.stderr alone cannot be filtered.) Where the descriptor cannot be
    redirected, nothing is filtered."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with tempfile.TemporaryFile() as capture:
            os.dup2(capture.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                capture.seek(0)
                lines = capture.read().decode("utf-8", "replace").splitlines(keepends=True)
                kept = "".join(line for line in lines if not is_load_noise(line, level))
                if kept:
                    sys.stderr.write(kept)
                    sys.stderr.flush()
    finally:
        os.close(saved)


def import_tensorflow():
    """TensorFlow, imported quietly: its C++ log at errors only (TF_CPP_MIN_LOG_LEVEL=2, set
    before the import) and its Python and absl loggers at errors, unless the user set
    TF_CPP_MIN_LOG_LEVEL (then TensorFlow logs as the user asked). Either way the lines
    absl prints while TensorFlow loads obey that level too (stderr_without_load_noise)."""
    user_set = bool(os.environ.get(TF_LOG_SETTING))  # set to a value (empty: not set)
    if not user_set:
        os.environ[TF_LOG_SETTING] = "2"
    with stderr_without_load_noise(log_level(os.environ[TF_LOG_SETTING])):
        import tensorflow as tf

    if not user_set:
        tf.get_logger().setLevel("ERROR")
        try:
            from absl import logging as absl_logging
            absl_logging.set_verbosity(absl_logging.ERROR)
        except ImportError:  # absl comes with TensorFlow; nothing to quiet without it
            pass
    return tf


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with its errors on one line (exit status 2):
    "PROG: error: MESSAGE (PROG --help lists the options)"."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the options)\n")


def whole_number(text, minimum=1):
    """argparse type: an integer of at least `minimum` (1,000,000 and 1_000_000 read too)."""
    try:
        value = int(text.replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum:,}, not {value:,}")
    return value


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's paragraphs and adds "(default: ...)" to every option that
    has a default its help does not name already (flags that are off by default: none)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or "default:" in text
                or "%(default)" in text or not action.option_strings):
            return text
        default = action.default
        if isinstance(default, int) and not isinstance(default, bool) and default >= 10_000:
            default = f"{default:,}"
        return f"{text} (default: {str(default).replace('%', '%%')})"


def duration(seconds):
    """"4.2 s", "2 min 5 s": a time as a person reads it."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"


class Stages:
    """Numbered stages on stdout: ``begin("Training ...")`` prints "[2/4] Training ...",
    ``end("12 ms per step")`` prints how long the stage took."""

    def __init__(self, total, out=None):
        self.total, self.number, self.out = total, 0, out or sys.stdout
        self.started = None

    def begin(self, text):
        self.number += 1
        self.started = time.perf_counter()
        print(f"[{self.number}/{self.total}] {text}", file=self.out, flush=True)

    def end(self, text=""):
        took = duration(time.perf_counter() - self.started)
        print(f"      done in {took}" + (f": {text}" if text else ""), file=self.out, flush=True)


class Progress:
    """A progress line on stderr for `total` items: on a terminal one line redrawn in place
    (a bar, the count, `note`, the time so far and the time left), elsewhere (a log, a
    pipe) a plain line at every tenth. The time left is estimated from the items after the
    first (the first one often compiles)."""

    WIDTH = 24
    REDRAW_S = 0.1  # on a terminal: at most this often, and at the last item

    def __init__(self, total, unit, stream=None):
        self.total, self.unit = max(1, total), unit
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.started = time.perf_counter()
        self.first_done = None
        self.next_line = 1  # the next tenth printed where the stream is not a terminal
        self.width = 0
        self.drawn = 0.0

    def left(self, done, now):
        """Seconds left, or None before there is a rate to go by."""
        if self.first_done is None or done <= 1:
            return None
        return (now - self.first_done) / (done - 1) * (self.total - done)

    def update(self, done, note=""):
        now = time.perf_counter()
        if done >= 1 and self.first_done is None:
            self.first_done = now
        elapsed, left = now - self.started, self.left(done, now)
        when = duration(elapsed) + (f", about {duration(left)} left"
                                    if left is not None and left >= 1 else "")
        count = f"{done:,}/{self.total:,} {self.unit}"
        if self.tty:
            if now - self.drawn < self.REDRAW_S and 0 < done < self.total:
                return
            self.drawn = now
            filled = self.WIDTH * done // self.total
            line = f"  [{'#' * filled}{'.' * (self.WIDTH - filled)}] {count}" + (
                f"  {note}" if note else "") + f"  {when}"
            line = line[:shutil.get_terminal_size().columns - 1]  # one row: \r redraws it
            self.stream.write("\r" + line.ljust(self.width))
            self.width = len(line)
            self.stream.flush()
        elif done * 10 >= self.next_line * self.total or done == self.total:
            self.next_line = done * 10 // self.total + 1
            print(f"  {count}" + (f"  {note}" if note else "") + f"  {when}", file=self.stream,
                  flush=True)

    def close(self):
        """Clears the line on a terminal (what follows starts at column 0)."""
        if self.tty and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0
