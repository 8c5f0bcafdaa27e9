"""A real task through the REST API: write a Unicode note in mousepad and save it."""

from __future__ import annotations

from tests.conftest import wait_until

SENTENCE = "Grüße aus der Sandbox: héllo ✓ 你好 Ω — naïve café, 1 + 1 = 2."


def _windows(api, desktop_id: str) -> list[dict]:
    return api.get(f"/api/desktops/{desktop_id}/windows").json()


def _act(api, desktop_id: str, *actions: dict) -> dict:
    response = api.post(f"/api/desktops/{desktop_id}/actions", json=list(actions))
    assert response.status_code == 200, response.text
    return response.json()


def test_write_and_save_a_unicode_note_in_mousepad(api, desktop):
    desktop_id = desktop["id"]
    launched = api.post(f"/api/desktops/{desktop_id}/launch", json={"app": "mousepad"})
    assert launched.status_code == 200, launched.text

    editor = wait_until(
        lambda: [w for w in _windows(api, desktop_id) if w["app"] == "Mousepad"],
        what="a mousepad window",
    )[0]
    _act(
        api,
        desktop_id,
        {"type": "wait_for_settle", "quiet_ms": 300},
        {"type": "click", "x": editor["x"] + 200, "y": editor["y"] + 200},
        {"type": "type", "text": SENTENCE},
        {"type": "key", "keys": "ctrl+s"},
    )
    # xfwm4 focuses a new dialog a moment after it is mapped: wait for both, as a person
    # waits for the dialog to take the keyboard before typing into it.
    wait_until(
        lambda: [
            w
            for w in _windows(api, desktop_id)
            if w["title"].startswith("Save As") and w["focused"]
        ],
        what="the Save As dialog, focused",
    )
    _act(
        api,
        desktop_id,
        {"type": "wait_for_settle", "quiet_ms": 200},
        {"type": "key", "keys": "ctrl+a"},
        # The chooser opens in the home folder; a bare name saves there, as a person would
        # type it (a typed path makes it read folders and pop up completions meanwhile).
        {"type": "type", "text": "note.txt"},
        {"type": "wait_for_settle", "quiet_ms": 300},
        {"type": "key", "keys": "enter"},
    )

    def saved() -> bytes | None:
        response = api.get(f"/api/desktops/{desktop_id}/files", params={"path": "~/note.txt"})
        return response.content if response.status_code == 200 else None

    assert wait_until(saved, timeout_s=20, what="~/note.txt").decode() == SENTENCE
    title = wait_until(
        lambda: [w["title"] for w in _windows(api, desktop_id) if w["app"] == "Mousepad"],
        what="mousepad's title",
    )[0]
    assert "note.txt" in title
