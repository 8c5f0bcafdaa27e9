"""The time marker on the desktop (`bench._marker_app`) and the page code that reads it back.

`start_marker()` copies the marker program into a desktop and runs it there in the
background; `SAMPLER_JS` is evaluated in a viewer page (ours or noVNC's) and, on every
animation frame, copies the code's pixels out of the picture the page shows (the `<video>`
or noVNC's canvas), decodes the time and keeps `latency = now − drawn` (milliseconds, both
clocks the host's: the sandbox shares it) each time the code changed. A read whose guards
or CRC do not match (the picture was mid-change, or the codec smeared it) is counted as
invalid and kept out.

For a `<video>`, each sample also gets the stages of the last frame the video presented
before the read (requestVideoFrameCallback metadata; nothing extra is read off the
picture): when its last packet arrived (`receiveTime`) and when it was handed to the
compositor (`presentationTime`), both minus the drawn time, so a latency splits into
desktop to browser, jitter buffer + decode, and compositor + page.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bench import _inside, _marker_app
from bench._service import Service

X, Y = 100, 200
"""Screen pixel of the code's top-left square (below the panel, clear of its menus)."""
PERIOD_MS = {"small": 5.0, "full": 1000 / 60}
"""How often the marker redraws: the code alone every 5 ms; the full screen at 60 Hz."""
REMOTE_PATH = "bench-marker.py"
"""Where the program goes, relative to the desktop's home."""

Mode = Literal["small", "full"]


def start_marker(service: Service, desktop_id: str, mode: Mode) -> _inside.InsideProcess:
    """Run the marker in `mode` (`small`: the code only; `full`: scrolling screen + code)."""
    _inside.write_file(service, desktop_id, REMOTE_PATH, Path(_marker_app.__file__).read_bytes())
    argv = [sys.executable, REMOTE_PATH, mode, str(X), str(Y), f"{PERIOD_MS[mode]:.3f}"]
    return _inside.start(service, desktop_id, f"bench-marker-{mode}", argv)


SAMPLER_JS = """(cfg) => {
  const W = cfg.squares * cfg.square, H = cfg.square, MOD = 2 ** cfg.timeBits;
  const canvas = document.createElement("canvas");
  canvas.width = W; canvas.height = H;
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  const s = { latencies: [], stages: [], invalid: 0, reads: 0, changes: 0, presented: 0 };
  s.last = -1;
  s.frame = null;
  const crc8 = (v) => {
    let crc = 0;
    for (const shift of [16, 8, 0]) {
      crc ^= (v >> shift) & 0xff;
      for (let i = 0; i < 8; i++) crc = crc & 0x80 ? ((crc << 1) ^ 0x07) & 0xff : (crc << 1) & 0xff;
    }
    return crc;
  };
  const decode = (source) => {
    ctx.drawImage(source, cfg.x, cfg.y, W, H, 0, 0, W, H);
    const d = ctx.getImageData(0, 0, W, H).data;
    const bits = [];
    for (let i = 0; i < cfg.squares; i++) {
      let sum = 0;
      for (let dy = -2; dy < 2; dy++) for (let dx = -2; dx < 2; dx++) {
        const o = ((H / 2 + dy) * W + i * cfg.square + cfg.square / 2 + dx) * 4;
        sum += d[o] + d[o + 1] + d[o + 2];
      }
      bits.push(sum / 48 > 127 ? 1 : 0);
    }
    const guards = cfg.guardLeft.length;
    const head = bits.slice(0, guards), tail = bits.slice(cfg.squares - guards);
    if (head.join() !== cfg.guardLeft.join() || tail.join() !== cfg.guardRight.join()) return null;
    let value = 0, crc = 0;
    for (let i = 0; i < cfg.timeBits; i++) value = value * 2 + bits[guards + i];
    for (let i = 0; i < cfg.crcBits; i++) crc = crc * 2 + bits[guards + cfg.timeBits + i];
    return crc8(value) === crc ? value : null;
  };
  const source = () => document.querySelector(cfg.selector);
  const tick = () => {
    const element = source();
    if (element && !(element instanceof HTMLVideoElement && element.readyState < 2)) {
      const now = Date.now();
      s.reads++;
      const value = decode(element);
      if (value === null) s.invalid++;
      else if (value !== s.last) {
        s.last = value;
        s.changes++;
        const since = (t) => (((Math.floor(t) % MOD) - value) % MOD + MOD) % MOD;
        const latency = since(now);
        if (latency < 10000) {
          s.latencies.push(latency);
          // The last frame the video reported; if it arrived before the code was drawn,
          // the picture read is a newer one not reported yet: no stages for this sample.
          const f = s.frame;
          const known = f && f.received && since(f.received) < 10000;
          s.stages.push(known ? [since(f.received), since(f.presented)] : null);
        } else s.invalid++;
      }
    }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
  const onVideoFrame = () => {
    const element = source();
    if (!(element instanceof HTMLVideoElement)) return setTimeout(onVideoFrame, 100);
    const count = (now, meta) => {
      s.presented = meta.presentedFrames;
      const at = (t) => (t === undefined ? null : performance.timeOrigin + t);
      s.frame = { received: at(meta.receiveTime), presented: at(meta.presentationTime) };
      element.requestVideoFrameCallback(count);
    };
    element.requestVideoFrameCallback(count);
  };
  onVideoFrame();
  window.__marker = s;
}"""
"""Installs `window.__marker` in a page; the argument is `sampler_config(selector)`."""


def sampler_config(selector: str) -> dict:
    """The code's geometry for `SAMPLER_JS`, reading the element `selector` shows."""
    return {
        "selector": selector,
        "x": X,
        "y": Y,
        "square": _marker_app.SQUARE,
        "squares": _marker_app.SQUARES,
        "timeBits": _marker_app.TIME_BITS,
        "crcBits": _marker_app.CRC_BITS,
        "guardLeft": list(_marker_app.GUARD_LEFT),
        "guardRight": list(_marker_app.GUARD_RIGHT),
    }


@dataclass(frozen=True)
class MarkerReading:
    """What a page read off the marker up to one moment (counts since the sampler started)."""

    at_s: float
    """`time.monotonic()` when read."""
    latencies_ms: int
    """How many latency samples the page holds (the samples themselves are fetched apart)."""
    changes: int
    """Distinct codes seen (pictures that changed the code, at most one per page frame)."""
    presented: int
    """`<video>` frames presented (requestVideoFrameCallback); 0 for a canvas."""
    reads: int
    invalid: int
    bytes: int
    """Bytes the page received for the picture (RTP payload and headers, or WebSocket
    message payloads)."""
