"""One implementation, two flavours: every call of the SDK is written once, as an *operation*
— a generator that yields the I/O it needs (:class:`Send` an HTTP request, :class:`Open` a
streamed answer and read it with :class:`Next`, :class:`Sleep`, :class:`Invoke` a user
callback, :class:`Emit` an item to an iterator, :class:`Spawn` an operation that runs on in
the background and :class:`Join` it) and gets the answers back — and run by a
driver: the blocking one (``httpx.Client``) behind ``Lizard``/``Sandbox``, the asyncio one
(``httpx.AsyncClient``) behind ``AsyncLizard``/``AsyncSandbox``. Request building, retry
rules, answer parsing and control flow (fallbacks, polling) live in the operations only; a
driver knows nothing but how to do one step.

A method defined with :class:`api` is the operation; reading it from an object of the
blocking flavour gives a function that runs it to the end, from one of the async flavour a
coroutine function. The flavour is a type parameter of each resource class (``Sync`` or
``Async``), so mypy knows which one a call returns."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Callable,
    Coroutine,
    Dict,
    Generator,
    Generic,
    Iterable,
    Iterator,
    Optional,
    Type,
    TypeVar,
    Union,
    overload,
)

from typing_extensions import Concatenate, ParamSpec

if TYPE_CHECKING:
    from ._http import AsyncHttpClient, AsyncWatchHandle, HttpClient, WatchHandle

T = TypeVar("T")
E = TypeVar("E")
P = ParamSpec("P")


class Sync:
    """The blocking flavour (a type parameter only)."""


class Async:
    """The asyncio flavour (a type parameter only)."""


#: A resource's flavour.
F = TypeVar("F", Sync, Async)


@dataclass(frozen=True)
class Request:
    """One HTTP request as the wire sees it (params already in query form)."""

    method: str
    path: str
    params: Dict[str, Any] = field(default_factory=dict)
    json: Any = None
    content: Optional[bytes] = None
    headers: Dict[str, str] = field(default_factory=dict)
    timeout: Optional[float] = None


@dataclass(frozen=True)
class Send:
    """Send a request once and read its whole answer (→ ``httpx.Response``; transport
    errors are thrown into the operation as httpx raised them)."""

    request: Request


@dataclass(frozen=True)
class Open:
    """Send a request and start reading its body as it arrives (→ a :class:`Body`; the
    driver closes it when the operation ends)."""

    request: Request
    lines: bool = False


@dataclass(frozen=True)
class Next:
    """The next piece of an opened body (``bytes``, or ``str`` lines), ``None`` at its end."""

    body: "Body"


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Invoke:
    """Call a user callback; the async driver awaits what it returns when it is awaitable,
    so async callbacks work there."""

    fn: Callable[..., Any]
    args: tuple = ()  # type: ignore[type-arg]


@dataclass(frozen=True)
class Started:
    """A background operation (``api_background``) is under way: its caller gets the
    handle now, and the rest runs on."""


@dataclass(frozen=True)
class Spawn:
    """Run ``op`` as ``api_background`` does (→ its ``WatchHandle`` in the blocking flavour,
    ``AsyncWatchHandle`` in the async one, once ``op`` yielded :class:`Started`)."""

    op: "Op[None]"


@dataclass(frozen=True)
class Join:
    """Wait until a spawned operation ended, stopping it first when ``stop``."""

    watch: Any
    stop: bool = False


@dataclass(frozen=True)
class Emit(Generic[E]):
    """Hand an item to the caller of an iterating operation."""

    item: E


Step = Union[Send, Open, Next, Sleep, Invoke, Started, Spawn, Join, Emit[Any]]
#: An operation returning ``T``.
Op = Generator[Step, Any, T]
#: An operation that yields items of type ``E`` (through :class:`Emit`) to an iterator.
Items = Generator[Union[Send, Open, Next, Sleep, Invoke, Started, Spawn, Join, Emit[E]], Any, None]


class Body:
    """An opened streamed answer: its request, the response (status and headers known) and
    the driver's iterator over its pieces."""

    def __init__(self, request: Request, response: Any, pieces: Any) -> None:
        self.request = request
        self.response = response
        self.pieces = pieces


class Flavoured(Generic[F]):
    """Something whose operations run on ``self._http``: a ``HttpClient`` (blocking) or an
    ``AsyncHttpClient``."""

    _http: "Union[HttpClient, AsyncHttpClient]"


class _Method:
    """What the descriptors below share: the operation function, and binding it to an
    object so that a call hands the operation to one of the client's drivers."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def _bind(self, obj: Any, drive: Callable[[Any], Any]) -> Callable[..., Any]:
        fn = self.fn

        @functools.wraps(fn)
        def bound(*args: Any, **kwargs: Any) -> Any:
            return drive(fn(obj, *args, **kwargs))

        return bound


class api(_Method, Generic[P, T]):
    """A method written as an operation; see the module doc."""

    def __init__(self, fn: Callable[Concatenate[Any, P], Op[T]]) -> None:
        super().__init__(fn)

    @overload
    def __get__(self, obj: None, owner: Any) -> "api[P, T]": ...
    @overload
    def __get__(self, obj: Flavoured[Sync], owner: Any) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: Flavoured[Async], owner: Any) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, obj: Any, owner: Any) -> Any:
        return self if obj is None else self._bind(obj, obj._http.run)


class api_items(_Method, Generic[P, E]):
    """A method written as an operation that emits items (``Items[E]``): an ``Iterator``
    in the blocking flavour, an ``AsyncIterator`` in the async one."""

    def __init__(self, fn: Callable[Concatenate[Any, P], Items[E]]) -> None:
        super().__init__(fn)

    @overload
    def __get__(self, obj: None, owner: Any) -> "api_items[P, E]": ...
    @overload
    def __get__(self, obj: Flavoured[Sync], owner: Any) -> Callable[P, Iterator[E]]: ...
    @overload
    def __get__(self, obj: Flavoured[Async], owner: Any) -> Callable[P, AsyncIterator[E]]: ...

    def __get__(self, obj: Any, owner: Any) -> Any:
        return self if obj is None else self._bind(obj, obj._http.iterate)


class api_background(_Method, Generic[P]):
    """A method written as an operation that runs on in the background once it yields
    :class:`Started`: the call returns a ``WatchHandle`` then (blocking flavour: a thread
    runs the rest) or an ``AsyncWatchHandle`` (async flavour: a task does); ``stop()`` on
    it ends the operation. An error before ``Started`` is the call's."""

    def __init__(self, fn: Callable[Concatenate[Any, P], Op[None]]) -> None:
        super().__init__(fn)

    @overload
    def __get__(self, obj: None, owner: Any) -> "api_background[P]": ...
    @overload
    def __get__(self, obj: Flavoured[Sync], owner: Any) -> "Callable[P, WatchHandle]": ...
    @overload
    def __get__(self, obj: Flavoured[Async], owner: Any) -> "Callable[P, Coroutine[Any, Any, AsyncWatchHandle]]": ...

    def __get__(self, obj: Any, owner: Any) -> Any:
        return self if obj is None else self._bind(obj, obj._http.spawn)


class static_api(_Method, Generic[P, T]):
    """A class-level operation (a static form such as ``Sandbox.create``): its flavour is
    the class's, its client ``http=`` or else the class's shared one for ``api_key=`` and
    ``api_url=`` (``_shared_http``); the operation gets the client as ``http``."""

    def __init__(self, fn: Callable[Concatenate[Any, P], Op[T]]) -> None:
        super().__init__(fn)

    @overload
    def __get__(self, obj: Any, owner: Type[Flavoured[Sync]]) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: Any, owner: Type[Flavoured[Async]]) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, obj: Any, owner: Any) -> Any:
        fn = self.fn

        @functools.wraps(fn)
        def bound(*args: Any, **kwargs: Any) -> Any:
            http = kwargs.get("http") or owner._shared_http(kwargs.get("api_key"), kwargs.get("api_url"))
            kwargs["http"] = http
            return http.run(fn(owner, *args, **kwargs))

        return bound


def invoke(fn: Optional[Callable[..., Any]], *args: Any) -> Op[None]:
    """Call ``fn`` (when given) with ``args`` as a step of an operation."""
    if fn is not None:
        yield Invoke(fn, args)


def from_iterable(pieces: Iterable[T]) -> Callable[[], Op[Optional[T]]]:
    """A reader of ``pieces`` in the form the decoders take (``None`` after the last): what
    a unit test feeds them instead of a streamed answer."""
    it = iter(pieces)

    def next_piece() -> Op[Optional[T]]:
        return next(it, None)
        yield  # an operation that needs no step

    return next_piece


def run_local(op: Op[T]) -> T:
    """Run an operation that needs no I/O (its callbacks are called, and what they raise
    is thrown into it, as the drivers do): the decoders' tests."""
    value: Any = None
    error: Optional[Exception] = None
    while True:
        try:
            step = op.throw(error) if error is not None else op.send(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        if not isinstance(step, Invoke):
            raise TypeError(f"{step!r} needs a client")
        value, error = None, None
        try:
            value = step.fn(*step.args)
        except Exception as e:
            error = e
