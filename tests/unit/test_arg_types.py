"""Job args checked against the handler's annotations at `@app.job` and at enqueue (jobs.py's
`check_context_param` and `ArgsChecker`): which annotations are allowed, what each accepts and
refuses, and the first parameter that must take the context. Runs without a runtime: `new_job`
is the one place every enqueue path (enqueue, enqueue_many, enqueue_tx) goes through."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Optional, TypedDict, Union

import pytest

import nursery_jobs as nj
from nursery_jobs.app import EnqueueOptions

if TYPE_CHECKING:
    from nursery_jobs import JobContext as HiddenContext


class Doc(TypedDict):
    id: int
    tags: list[str]


class Thing:
    pass


app = nj.App()


@app.job()
async def typed(
    ctx: nj.JobContext,
    doc_id: int,
    ratio: float = 1.0,
    name: str = "",
    flag: bool = False,
    nothing: None = None,
    ids: list[int] | None = None,
    meta: dict[str, str] | None = None,
    mode: Literal["fast", "slow"] = "fast",
    either: Union[int, str] = 0,
    doc: Optional[Doc] = None,
    anything: Any = None,
    untyped=None,  # type: ignore[no-untyped-def]
) -> None:
    pass


@app.job()
async def extras(ctx: nj.JobContext, first: int, **rest: int) -> None:
    pass


def _enqueue(kind: nj.JobKind, **args: Any) -> None:
    kind.new_job(args, EnqueueOptions(), 0.0)


@pytest.mark.parametrize(
    "args",
    [
        {"doc_id": 1},
        {"doc_id": -(2**100)},  # ints past 64 bits are JSON ints too
        {"doc_id": 1, "ratio": 2},  # a JSON int is a valid float (JSON has one number type)
        {"doc_id": 1, "ratio": -0.0, "name": "\x00\udcff", "flag": True, "nothing": None},
        {"doc_id": 1, "ids": [1, 2], "meta": {"a": "b"}, "mode": "slow", "either": "x"},
        {"doc_id": 1, "doc": {"id": 3, "tags": ["a"]}, "anything": {"x": [1, None]}, "untyped": [1.5]},
    ],
)
def test_values_of_the_annotated_types_are_accepted(args):
    _enqueue(typed, **args)


@pytest.mark.parametrize(
    "args, argument, expected",
    [
        ({"doc_id": "1"}, "doc_id", "must be int, not '1'"),
        ({"doc_id": True}, "doc_id", "must be int, not True"),  # bool is not an int in JSON
        ({"doc_id": 1.0}, "doc_id", "must be int, not 1.0"),  # nor an integral float
        ({"doc_id": 1, "ratio": "2"}, "ratio", "must be float"),
        ({"doc_id": 1, "ratio": False}, "ratio", "must be float, not False"),
        ({"doc_id": 1, "flag": 1}, "flag", "must be bool, not 1"),
        ({"doc_id": 1, "nothing": 0}, "nothing", "must be None, not 0"),
        ({"doc_id": 1, "ids": [1, "2"]}, "ids", r"at ids\[1\]"),
        ({"doc_id": 1, "meta": {"a": 1}}, "meta", "must be"),
        ({"doc_id": 1, "mode": "medium"}, "mode", r"must be Literal\['fast', 'slow'\]"),
        ({"doc_id": 1, "either": 1.5}, "either", "must be"),
        ({"doc_id": 1, "doc": {"id": 1}}, "doc", "missing required field `tags`"),
        ({"doc_id": 1, "doc": {"id": 1, "tags": [2]}}, "doc", r"at doc.tags\[0\]"),
    ],
)
def test_a_value_of_another_type_is_an_args_error_naming_kind_argument_and_both_types(args, argument, expected):
    with pytest.raises(nj.ArgsError, match=rf"job 'typed': argument '{argument}' .*{expected}"):
        _enqueue(typed, **args)


def test_missing_and_unknown_arguments_are_args_errors():
    with pytest.raises(nj.ArgsError, match="do not fit job 'typed': missing a required argument: 'doc_id'"):
        _enqueue(typed)
    with pytest.raises(nj.ArgsError, match="do not fit job 'typed': got an unexpected keyword argument 'docs' \\(it takes doc_id: 'int'"):
        _enqueue(typed, doc_id=1, docs=None)


def test_var_keyword_values_are_checked_against_its_annotation():
    _enqueue(extras, first=1, a=2, b=3)
    with pytest.raises(nj.ArgsError, match="job 'extras': argument 'b' must be int, not 'x'"):
        _enqueue(extras, first=1, a=2, b="x")


def test_every_enqueue_path_checks_types_in_the_one_place():
    with pytest.raises(nj.ArgsError, match="argument 'doc_id' must be int"):
        typed.new_jobs([{"doc_id": 1}, {"doc_id": "2"}], EnqueueOptions(), 0.0)


def test_the_handler_receives_what_was_enqueued_unconverted():
    job = typed.new_job({"doc_id": 1, "ratio": 2}, EnqueueOptions(), 0.0)
    assert job.args_json == '{"doc_id":1,"ratio":2}'  # 2 stays an int: nothing is converted


@pytest.mark.parametrize(
    "annotation, message",
    [
        ("Thing", "the annotation <class .*Thing'> is not a JSON type"),
        ("tuple[int, int]", "is not a JSON type"),
        ("set[int]", "is not a JSON type"),
        ("dict[int, str]", r"keys that are not str.*dict\[str, \.\.\.\]"),
        ("Literal[1.5]", "Literal values must be str, int, bool or None"),
        ("list[Thing]", "is not a JSON type"),
    ],
)
def test_annotations_that_are_not_json_types_are_refused_at_declaration(annotation, message):
    namespace: dict[str, Any] = {}
    exec(f"async def handler(ctx, value: {annotation}) -> None: pass", globals(), namespace)
    with pytest.raises(nj.ConfigError, match=rf"job 'handler', argument 'value': .*{message}"):
        nj.App().job()(namespace["handler"])


@pytest.mark.parametrize(
    "source",
    [
        "async def index_doc(doc_id): pass",
        "async def index_doc(doc_id: int): pass",
        "async def index_doc(): pass",
        "async def index_doc(*, ctx): pass",
        "async def index_doc(**kwargs): pass",
        "async def index_doc(ctx: int, doc_id: int): pass",
    ],
)
def test_a_first_parameter_that_cannot_take_the_context_is_a_config_error_at_declaration(source):
    namespace: dict[str, Any] = {}
    exec(source, globals(), namespace)
    with pytest.raises(nj.ConfigError, match=r"job handler 'index_doc' .*async def index_doc\(ctx: nj.JobContext"):
        nj.App().job()(namespace["index_doc"])


def test_context_parameters_that_are_accepted():
    local = nj.App()

    async def plain(ctx, doc_id: int):  # type: ignore[no-untyped-def]
        pass

    async def underscore(_, doc_id: int) -> None:
        pass

    async def hidden(ctx: HiddenContext, doc_id: int) -> None:  # only imported under TYPE_CHECKING
        pass

    async def any_ctx(c: Any) -> None:
        pass

    for fn in (plain, underscore, hidden, any_ctx):
        local.job()(fn)
    with pytest.raises(nj.ArgsError, match="argument 'doc_id' must be int"):
        _enqueue(local.kind("hidden"), doc_id="1")


def test_an_argument_annotation_that_cannot_be_evaluated_says_to_import_it():
    namespace: dict[str, Any] = {}
    exec("async def handler(ctx, value: Missing) -> None: pass", globals(), namespace)
    with pytest.raises(nj.ConfigError, match="Missing.? of argument 'value' cannot be evaluated.*not under TYPE_CHECKING"):
        nj.App().job()(namespace["handler"])
