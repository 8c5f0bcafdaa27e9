"""OSWorld's metric functions that apply to a Cubicle desktop's apps, with OSWorld's names,
arguments and scores (0.0 to 1.0; a task passes at 1.0).

A metric gets the result getter's value, then the expected getter's value when the task
names one (else nothing), then the evaluator's `options` as keywords, as in OSWorld's
`DesktopEnv.evaluate`. Where OSWorld leans on a heavy package, the port says what it does
instead: `fuzzy_match` uses difflib's ratio (1.0 exactly when OSWorld's rapidfuzz gives
1.0), and URLs are compared without tldextract (scheme and host lower-cased, a leading
`www.` and a trailing `/` dropped, the public suffix kept).
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse, urlunparse

from cubicle.evals.a11y_xml import NAMESPACES

Score = float
MetricFn = Callable[..., Score]


def _text(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError:
        return None


def exact_match(result: Any, rules: dict[str, Any]) -> Score:
    return float(result == rules["expected"])


def match_in_list(result: Any, rules: dict[str, Any]) -> Score:
    return float(result in rules["expected"])


def is_in_list(result: Any, rules: dict[str, Any]) -> Score:
    """Whether the expected value is in the result (a list, or a substring of a text)."""
    if result is None:
        return 0.0
    return float(rules["expected"] in result)


def literal_match(result: Any, expected: Any, **options: Any) -> Score:
    kind = options.get("type", "str")
    fold = options.get("ignore_case", False)
    if kind == "str":
        a, b = str(result), str(expected)
        return float(a.lower() == b.lower() if fold else a == b)
    if kind == "list":
        if not isinstance(result, list | tuple) or not isinstance(expected, list | tuple):
            return 0.0
        a_list = [str(s).lower() if fold else str(s) for s in result]
        b_list = [str(s).lower() if fold else str(s) for s in expected]
        return float(a_list == b_list)
    raise ValueError(f"literal_match: type {kind!r} is not str or list")


def check_include_exclude(result: str | None, rules: dict[str, list[str]]) -> Score:
    if result is None:
        return 0.0
    include, exclude = rules.get("include", []), rules.get("exclude", [])
    return float(all(r in result for r in include) and all(r not in result for r in exclude))


def fuzzy_match(result: str, rules: dict[str, Any]) -> Score:
    return difflib.SequenceMatcher(a=str(result), b=str(rules["expected"])).ratio()


def compare_text_file(actual: str | None, expected: str | None, **options: Any) -> Score:
    """Whether two files hold the same text (`ignore_blanks`, `ignore_case`)."""
    actual_text, expected_text = _text(actual), _text(expected)
    if actual_text is None or expected_text is None:
        return 0.0
    if options.get("ignore_blanks", False):
        actual_text = re.sub(r"\s+", " ", re.sub(r"[\t\n]", " ", actual_text).strip())
        expected_text = re.sub(r"\s+", " ", re.sub(r"[\t\n]", " ", expected_text).strip())
    if options.get("ignore_case", False):
        actual_text, expected_text = actual_text.lower(), expected_text.lower()
    return float(actual_text == expected_text)


def diff_text_file(result: str | None, expect: str | None) -> Score:
    a, b = _text(result), _text(expect)
    if a is None or b is None:
        return 0.0
    return difflib.SequenceMatcher(a=a.splitlines(), b=b.splitlines()).ratio()


def file_contains(file_path: str | None, config: dict[str, list[str]]) -> Score:
    text = _text(file_path)
    if text is None:
        return 0.0
    return float(all(item in text for item in config["expected"]))


def check_list(result: str | None, rules: dict[str, list[str]]) -> Score:
    """Every `expect` regex matches some line of the file; no `unexpect` regex matches one."""
    text = _text(result)
    if text is None:
        return 0.0
    expect = [re.compile(p) for p in rules.get("expect", [])]
    unexpect = [re.compile(p) for p in rules.get("unexpect", [])]
    lines = text.splitlines()
    found = all(any(p.search(line) for line in lines) for p in expect)
    clean = not any(p.search(line) for p in unexpect for line in lines)
    return float(found and clean)


def check_direct_json_object(result: Any, rules: dict[str, Any]) -> Score:
    """The result (a dict, or JSON text) has every expected key with the expected value."""
    if isinstance(result, str):
        try:
            result = json.loads(result.strip().replace("'", '"'))
        except json.JSONDecodeError:
            return 0.0
    if not isinstance(result, dict):
        return 0.0
    expected = rules.get("expected", {})
    fold = rules.get("ignore_case", False)

    def same(a: Any, b: Any) -> bool:
        return str(a).lower() == str(b).lower() if fold else a == b

    return float(all(key in result and same(result[key], value) for key, value in expected.items()))


def check_accessibility_tree(
    result: str | None, rules: list[dict[str, Any]], osname: str = "ubuntu"
) -> Score:
    """Every rule selects at least one element (XPath or CSS selectors under OSWorld's
    namespaces) and, with `text`, one whose text matches (exactly, or by ratio)."""
    import lxml.etree
    from lxml.cssselect import CSSSelector

    if not result:
        return 0.0
    tree = lxml.etree.fromstring(result.encode())
    total = 1.0
    for rule in rules:
        if "xpath" in rule:
            elements = tree.xpath(rule["xpath"], namespaces=NAMESPACES)
        elif "selectors" in rule:
            elements = CSSSelector(", ".join(rule["selectors"]), namespaces=NAMESPACES)(tree)
        else:
            raise ValueError("check_accessibility_tree: a rule needs `xpath` or `selectors`")
        if not elements:
            return 0.0
        if "text" in rule:
            exact = rule.get("exact", True)
            scores = [
                float((el.text or None) == rule["text"])
                if exact
                else difflib.SequenceMatcher(a=el.text or "", b=rule["text"]).ratio()
                for el in elements
            ]
            total *= max(scores)
    return total


def _normal_url(url: str) -> str:
    if not re.match(r"^[a-zA-Z][a-zA-Z0-9+\-.]*://", url):
        url = f"http://{url}"
    parts = urlparse(url)
    host = parts.netloc.lower().removeprefix("www.")
    path = "" if parts.path == "/" else parts.path
    return urlunparse((parts.scheme.lower(), host, path, parts.params, parts.query, parts.fragment))


def compare_urls(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a == b
    return _normal_url(a) == _normal_url(b)


def is_expected_active_tab(active_tab_info: Any, rule: dict[str, Any]) -> Score:
    if not active_tab_info:
        return 0.0
    if rule.get("type") != "url":
        raise ValueError(f"is_expected_active_tab: type {rule.get('type')!r} is not url")
    url = active_tab_info.get("url") if isinstance(active_tab_info, dict) else active_tab_info
    return float(compare_urls(rule["url"], url))


def is_expected_tabs(open_tabs: list[dict[str, str]] | None, rule: dict[str, Any]) -> Score:
    if not open_tabs:
        return 0.0
    if rule.get("type") != "url":
        raise ValueError(f"is_expected_tabs: type {rule.get('type')!r} is not url")
    expected, actual = rule["urls"], [tab["url"] for tab in open_tabs]
    return float(
        len(expected) == len(actual)
        and all(any(compare_urls(e, a) for a in actual) for e in expected)
    )


def is_expected_url_pattern_match(result: Any, rules: dict[str, Any]) -> Score:
    url = result.get("url") if isinstance(result, dict) else result
    if not isinstance(url, str):
        return 0.0
    return float(all(re.search(pattern, url) for pattern in rules["expected"]))


METRICS: dict[str, MetricFn] = {
    fn.__name__: fn
    for fn in (
        exact_match,
        match_in_list,
        is_in_list,
        literal_match,
        check_include_exclude,
        fuzzy_match,
        compare_text_file,
        diff_text_file,
        file_contains,
        check_list,
        check_direct_json_object,
        check_accessibility_tree,
        is_expected_active_tab,
        is_expected_tabs,
        is_expected_url_pattern_match,
    )
}
"""Metric name → function. `infeasible` and `python` are handled by the checker."""

SPECIAL = ("infeasible", "python")
"""Metrics the checker itself scores: `infeasible` (the agent said the task cannot be
done), `python` (a snippet run inside the desktop)."""


@functools.cache
def known() -> frozenset[str]:
    return frozenset((*METRICS, *SPECIAL))
