"""The `live` benchmark's figures: per-window deltas, medians over rounds, targets."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

from bench._pages import Kind
from bench._run import Target
from bench._stats import summarize

TARGET_P50_MS = 80.0
TARGET_VS_NOVNC = 0.5
"""Our median latency at most this fraction of noVNC's."""
TARGET_FPS = 25.0
TARGET_FAN_OUT = 1.15
"""CPU with five viewers at most this many times that with one."""
TARGET_STATIC_CORES = 0.02


def encoder_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """What the guest's encoder did between two `GET /frames/stats`, per frame encoded."""
    d = {k: after[k] - before[k] for k in ("frames_captured", "frames_skipped", "frames_encoded")}
    frames = max(d["frames_encoded"], 1)
    for name in ("encode_seconds", "cpu_seconds"):
        d[name.replace("_seconds", "_ms_per_frame")] = round(
            1000 * (after[name] - before[name]) / frames, 2
        )
    return d


def per_frame(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Chromium's receiver between two readings: mean milliseconds per frame, and counts."""
    d = {name: after[name] - before[name] for name in after}
    emitted, decoded = max(d["jitterBufferEmittedCount"], 1), max(d["framesDecoded"], 1)
    return {
        "jitter_buffer_ms": round(1000 * d["jitterBufferDelay"] / emitted, 2),
        "jitter_buffer_target_ms": round(1000 * d["jitterBufferTargetDelay"] / emitted, 2),
        "jitter_buffer_minimum_ms": round(1000 * d["jitterBufferMinimumDelay"] / emitted, 2),
        "decode_ms": round(1000 * d["totalDecodeTime"] / decoded, 2),
        "processing_ms": round(1000 * d["totalProcessingDelay"] / decoded, 2),
        **{k: d[k] for k in ("framesDecoded", "framesDropped", "freezeCount", "nackCount")},
    }


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else float("nan")


def _median_cores(readings: list[dict[str, float]]) -> dict[str, float]:
    return {name: _median([r[name] for r in readings]) for name in readings[0]}


def latency_figures(data: dict[str, list]) -> dict[str, Any]:
    """Latency alone, for a configuration measured in latency rounds only."""
    latency = [ms / 1000 for chunk in data["latency"] for ms in chunk]
    return {
        "latency": asdict(summarize(latency)),
        "latency_invalid_reads": sum(data["invalid_reads"]),
        "rounds": {"latency_p50": [round(v, 3) for v in data["latency_p50"]]},
    }


def transport_figures(kind: Kind, data: dict[str, list]) -> dict[str, Any]:
    latency = [ms / 1000 for chunk in data["latency"] for ms in chunk]
    moving = [ms / 1000 for chunk in data["latency_moving"] for ms in chunk]
    one, five = _median(data["whole_one"]), _median(data["whole_five"])
    figures: dict[str, Any] = {
        "latency": asdict(summarize(latency)),
        "latency_invalid_reads": sum(data["invalid_reads"]),
        "latency_while_moving": asdict(summarize(moving)) if moving else None,
        "page_fps": _median(data["page_fps"]),
        "video_fps": _median(data["video_fps"]) if kind == "ours" else None,
        "kbit_per_s": _median(data["kbit_per_s"]),
        "page_fps_with_five_viewers": _median(data["page_fps_five"]),
        "extra_viewer_pictures_per_s": _median(data["extra_pictures_per_s"])
        if kind == "ours"
        else None,
        "extra_viewer_kbit_per_s": _median(data["extra_kbit_per_s"]),
        "streaming_cpu_ms_per_page_frame": round(
            1000 * _median(data["streaming_one"]) / max(_median(data["page_fps"]), 0.1), 1
        ),
        "cpu_cores": {
            "one_viewer": one,
            "five_viewers": five,
            "five_over_one": _median(data["five_over_one"]),
            "five_over_one_per_encoded_frame": _median(data["five_over_one_per_frame"])
            if kind == "ours"
            else None,
            "guest_encoded_fps_one_viewer": _median(data["encoded_fps_one"]),
            "guest_encoded_fps_five_viewers": _median(data["encoded_fps_five"]),
            "static_one_viewer": _median(data["whole_static"]),
            "streaming_one_viewer": _median(data["streaming_one"]),
            "streaming_five_viewers": _median(data["streaming_five"]),
            "streaming_static": _median(data["streaming_static"]),
        },
        "cpu_cores_by_program": {
            name: _median_cores(data[f"cpu_{name}"]) for name in ("one", "five", "static")
        },
        "rounds": {
            name: [round(v, 3) for v in data[name]]
            for name in (
                "latency_p50",
                "page_fps",
                "whole_one",
                "whole_five",
                "five_over_one",
                "encoded_fps_one",
                "encoded_fps_five",
                "whole_static",
                "teardown_s",
            )
        },
    }
    if kind == "ours":
        figures["rounds"]["five_over_one_per_frame"] = [
            round(v, 3) for v in data["five_over_one_per_frame"]
        ]
        stages = [x for chunk in data["latency_stages"] for x in chunk if x is not None]
        figures["latency_stages"] = (
            {
                "drawn_to_received": asdict(summarize([x[0] / 1000 for x in stages])),
                "drawn_to_presented": asdict(summarize([x[1] / 1000 for x in stages])),
                "drawn_to_read": figures["latency"],
            }
            if stages
            else None
        )
        figures["browser_receiver"] = {
            "marker_only": data["receiver_still"],
            "moving_one_viewer": data["receiver_moving"],
        }
        figures["guest_encoder"] = {
            "marker_only": data["encoder_still"],
            "moving_one_viewer": data["encoder_moving"],
        }
    return figures


def targets(ours: dict[str, Any], novnc: dict[str, Any]) -> list[Target]:
    p50, theirs = ours["latency"]["p50_ms"], novnc["latency"]["p50_ms"]
    cpu = ours["cpu_cores"]
    return [
        Target(f"latency p50 ≤ {TARGET_P50_MS:.0f} ms on loopback", p50 <= TARGET_P50_MS),
        Target("latency p50 ≤ half of noVNC's", p50 <= TARGET_VS_NOVNC * theirs),
        Target(
            f"≥ {TARGET_FPS:.0f} fps at 1280×800, moving screen", ours["page_fps"] >= TARGET_FPS
        ),
        Target(
            f"CPU with 5 viewers ≤ {TARGET_FAN_OUT} × with 1",
            cpu["five_over_one"] <= TARGET_FAN_OUT,
        ),
        Target(
            f"static screen, 1 viewer: ≤ {TARGET_STATIC_CORES:.0%} of a core",
            cpu["static_one_viewer"] <= TARGET_STATIC_CORES,
        ),
    ]
