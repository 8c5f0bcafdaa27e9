"""What a person would leave behind after doing each built-in task, done the quick way.

The checker tests run each task's setup on a fresh desktop, check (it must fail), apply the
task's solution here, and check again (it must pass). A solution changes the desktop only
as a user could: shell commands, files, keys pressed with pyautogui inside the desktop,
tabs opened through the browser's own DevTools.
"""

from __future__ import annotations

from dataclasses import dataclass

H = "/home/user"
SITE = f"file://{H}/site"


@dataclass(frozen=True)
class Shell:
    command: str


@dataclass(frozen=True)
class Keys:
    """pyautogui calls inside the desktop, e.g. `press('space', presses=3)`."""

    calls: str


@dataclass(frozen=True)
class Tabs:
    urls: tuple[str, ...]


@dataclass(frozen=True)
class Open:
    path: str


Step = Shell | Keys | Tabs | Open

SOLUTIONS: dict[str, tuple[Step, ...]] = {
    "mousepad-fix-typo": (Shell(f"sed -i 's/brwn/brown/' {H}/notes.txt"),),
    "mousepad-append-line": (Shell(f"echo '3. test the evals' >> {H}/todo.txt"),),
    "mousepad-replace-word": (Shell(f"sed -i 's/cat/dog/g' {H}/pets.txt"),),
    "mousepad-delete-line": (Shell(f"sed -i '/DELETE ME/d' {H}/shopping.txt"),),
    "mousepad-write-new-file": (Shell(f"printf 'Hello, Cubicle!' > {H}/hello.txt"),),
    "mousepad-save-as": (Shell(f"cp {H}/draft.txt {H}/Documents/final.txt"),),
    "mousepad-json-config": (
        Shell(f"""printf '{{"rooms": 3, "name": "cubicle"}}\\n' > {H}/config.json"""),
    ),
    "mousepad-open-readme": (Open(f"{H}/readme.txt"),),
    "terminal-mkdir": (Shell(f"mkdir -p {H}/projects/cubicle"),),
    "terminal-count-lines": (Shell(f"wc -l < {H}/data.csv > {H}/count.txt"),),
    "terminal-make-executable": (Shell(f"chmod +x {H}/run.sh"),),
    "terminal-largest-file": (Shell(f'cd {H}/Downloads && mv "$(ls -S | head -1)" big.bin'),),
    "terminal-extract": (
        Shell(f"mkdir -p {H}/extracted && tar -C {H}/extracted -xzf {H}/archive.tar.gz"),
    ),
    "terminal-sort-names": (Shell(f"sort {H}/names.txt > {H}/sorted.txt"),),
    "terminal-today": (Shell(f"date +%F > {H}/today.txt"),),
    "files-create-folder": (Shell(f"mkdir {H}/Reports"),),
    "files-rename": (Shell(f"mv {H}/Documents/old-name.txt {H}/Documents/new-name.txt"),),
    "files-move-photos": (Shell(f"mv {H}/Inbox/*.jpg {H}/Pictures/"),),
    "files-delete": (Shell(f"rm {H}/junk.tmp"),),
    "files-copy": (Shell(f"cp {H}/Documents/report.txt {H}/Backup/"),),
    "files-open-documents": (Keys(f"hotkey('ctrl', 'l'); write('{H}/Documents\\n')"),),
    "chrome-follow-link": (Tabs((f"{SITE}/about.html",)),),
    "chrome-fill-form": (Keys("write('Ada'); press('enter')"),),
    "chrome-agree": (Keys("press('tab'); press('space'); press('tab'); press('enter')"),),
    "chrome-new-tab": (Tabs((f"{SITE}/contact.html",)),),
    "chrome-counter": (Keys("press('space', presses=3, interval=0.05)"),),
    "chrome-pick-colour": (Keys("press('tab'); write('B'); press('tab'); press('enter')"),),
    "settings-wm-theme": (Shell("xfconf-query -c xfwm4 -p /general/theme -s Kokodi"),),
    "settings-double-click": (Shell("xfconf-query -c xsettings -p /Net/DoubleClickTime -s 600"),),
    "settings-font-size": (
        Shell(
            "xfconf-query -c xsettings -p /Gtk/FontName -s "
            "\"$(xfconf-query -c xsettings -p /Gtk/FontName | sed 's/[0-9]*$/12/')\""
        ),
    ),
    "os-infeasible-photoshop": (),
}
"""Task id → the steps that complete it. The infeasible task is solved by saying so."""
