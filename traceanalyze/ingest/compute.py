"""The Arrow compute functions the parser calls, through Arrow's function registry (``pyarrow._compute``).

``import pyarrow.compute`` builds a Python wrapper, with its signature and docstring, for each of Arrow's ~290
functions: ~40 ms of every process that parses, a tenth of a cold report of one small file. These are the calls
those wrappers make, with the same options (none where the parser passes none: the function's defaults apply), so
the results are the same arrays. Arrow's own methods that compute (``Array.cast``, ``Table.filter``) import
``pyarrow.compute`` on first use: the parser calls :func:`cast` and :func:`filter` here instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyarrow import _compute

call_function = _compute.call_function


def _function(name: str) -> Callable[..., Any]:
    """``pyarrow.compute.<name>`` called without options: its positional arguments are the function's."""

    def call(*args: Any) -> Any:
        return call_function(name, list(args))

    call.__name__ = name
    return call


abs = _function("abs")  # noqa: A001 - pyarrow.compute's name
add = _function("add")
and_ = _function("and")
any = _function("any")  # noqa: A001 - pyarrow.compute's name
coalesce = _function("coalesce")
floor = _function("floor")
greater = _function("greater")
greater_equal = _function("greater_equal")
if_else = _function("if_else")
invert = _function("invert")
is_finite = _function("is_finite")
is_valid = _function("is_valid")
less = _function("less")
less_equal = _function("less_equal")
multiply = _function("multiply")
or_ = _function("or")
round = _function("round")  # noqa: A001 - half to even, Arrow's default, as pyarrow.compute.round
subtract = _function("subtract")
sum = _function("sum")  # noqa: A001 - skip nulls, min_count 1, as pyarrow.compute.sum


def cast(arr: Any, target_type: pa.DataType) -> Any:
    """``pyarrow.compute.cast(arr, target_type)``: a safe cast (an overflow raises)."""
    return call_function("cast", [arr], _compute.CastOptions.safe(target_type))


def take(data: Any, indices: Any) -> Any:
    return call_function("take", [data, indices], _compute.TakeOptions(boundscheck=True))


def index_in(values: Any, value_set: pa.Array) -> Any:
    return call_function("index_in", [values], _compute.SetLookupOptions(value_set))


def is_in(values: Any, value_set: pa.Array) -> Any:
    return call_function("is_in", [values], _compute.SetLookupOptions(value_set))


def fill_null(values: Any, fill_value: Any) -> Any:
    """``pyarrow.compute.fill_null``: a Python value becomes a scalar of ``values``' type."""
    if not isinstance(fill_value, (pa.Array, pa.ChunkedArray, pa.Scalar)):
        fill_value = pa.scalar(fill_value, type=values.type)
    elif values.type != fill_value.type:
        fill_value = pa.scalar(fill_value.as_py(), type=values.type)
    return call_function("coalesce", [values, fill_value])


def filter(data: Any, mask: Any) -> Any:  # noqa: A001 - pyarrow.compute's name
    """``data.filter(mask)`` of an Array or Table: rows where ``mask`` is null are dropped."""
    return call_function("filter", [data, mask], _compute.FilterOptions("drop"))


def dictionary_encode(values: Any, null_encoding: str = "mask") -> Any:
    """``pyarrow.compute.dictionary_encode``: ``null_encoding="encode"`` gives null an index of its own."""
    return call_function("dictionary_encode", [values], _compute.DictionaryEncodeOptions(null_encoding))


def array_sort_indices(values: Any, null_placement: str = "at_end") -> Any:
    """``pyarrow.compute.array_sort_indices`` in ascending order."""
    options = _compute.ArraySortOptions("ascending", null_placement=null_placement)
    return call_function("array_sort_indices", [values], options)
