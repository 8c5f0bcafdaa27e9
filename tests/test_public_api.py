"""The names users import from `desktop` are pinned: changing them is a breaking change."""

import desktop


def test_public_names_are_pinned():
    assert desktop.__all__ == [
        "Action",
        "ActionsResponse",
        "AsyncDesktop",
        "CubicleError",
        "Desktop",
        "DesktopGone",
        "DesktopInfo",
        "DesktopNotFound",
        "ExecResult",
        "FileEntry",
        "InvalidRequest",
        "OffScreen",
        "PathNotAllowed",
        "UnknownKey",
        "WindowInfo",
        "list_desktops",
    ]
    for name in desktop.__all__:
        assert getattr(desktop, name).__name__ in (name, "Annotated")


def test_every_error_code_is_unique_and_round_trips():
    from desktop import errors

    classes = errors.error_classes()
    codes = [cls.code for cls in classes]
    assert len(codes) == len(set(codes))
    for cls in classes:
        rebuilt = errors.from_code(cls.code, "message")
        assert type(rebuilt) is cls and rebuilt.message == "message"
