"""Headless Chromium driven over the DevTools protocol, for tests that look at a built page.

Chromium's ``--remote-debugging-pipe`` reads protocol commands (JSON, each ended by a NUL
byte) from file descriptor 3 and writes replies to 4, so no package beyond the standard
library is needed. Debian's ``chromium`` (tools/install_system_deps.sh installs it).
"""
import json
import os
import shutil
import subprocess
import time

__all__ = ["Chromium", "find_chromium"]


def find_chromium():
    """The Chromium binary on PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Chromium:
    """One headless browser with one page: ``open(url)``, ``evaluate(js)``, ``wait_for``."""

    def __init__(self, binary, profile_dir):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        command = (f"exec '{binary}' --headless=new --no-sandbox --disable-gpu --no-first-run "
                   f"--user-data-dir='{profile_dir}' --remote-debugging-pipe about:blank "
                   f"3<&{to_chrome_r} 4>&{from_chrome_w}")
        self.process = subprocess.Popen(["bash", "-c", command],
                                        pass_fds=(to_chrome_r, from_chrome_w),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._pending = b""
        self._last_id = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target,
                                  flatten=True)["sessionId"]
        self.call("Page.enable", page=True)

    def call(self, method, page=False, **params):
        """Sends one protocol command (to the page when `page`), returns its result."""
        self._last_id += 1
        message = {"id": self._last_id, "method": method, "params": params}
        if page:
            message["sessionId"] = self._session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._pending:
                chunk = os.read(self._from_chrome, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed its protocol pipe")
                self._pending += chunk
            raw, self._pending = self._pending.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._last_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def open(self, url):
        self.call("Page.navigate", page=True, url=url)

    def evaluate(self, expression):
        """The value of a JavaScript expression in the page (JSON-able)."""
        result = self.call("Runtime.evaluate", page=True, expression=expression,
                           returnByValue=True)["result"]
        return result.get("value")

    def wait_for(self, expression, timeout=30):
        """Polls `expression` until it is truthy; returns it (or the last value at timeout)."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.25)
        return value

    def screenshot(self, path):
        import base64

        data = self.call("Page.captureScreenshot", page=True, format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.call("Browser.close")
        except (OSError, RuntimeError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)
