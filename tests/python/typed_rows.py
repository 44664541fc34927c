"""The typed stream every driver test writes and reads back: one column of
each supported type, a full row, an edge-value row and an all-NULL row.

Drivers differ only in how they pass json/jsonb values, so the rows are
built with the driver's wrappers (`full(Json, Jsonb)`); what comes back is
the same for all of them."""

from datetime import date, datetime, timezone
from decimal import Decimal
from uuid import UUID

TYPED_DDL = (
    "CREATE STREAM typed (flag boolean, i2 smallint, i4 integer, i8 bigint, f4 real, "
    "f8 double precision, num numeric(10,3), txt text, vc varchar(5), bin bytea, "
    "tstz timestamptz, tsp timestamp, day date, doc json, docb jsonb, id uuid)"
)
COLUMNS = ["flag", "i2", "i4", "i8", "f4", "f8", "num", "txt", "vc", "bin",
           "tstz", "tsp", "day", "doc", "docb", "id"]

UTC = timezone.utc


def full(doc, docb):
    """The full row, with json and jsonb values wrapped by `doc` / `docb`."""
    return (True, 12, 345, 6789012345, 1.5, 2.25, Decimal("12.5"), "hello world", "abc",
            b"\xde\xad\xbe\xef", datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
            datetime(2024, 1, 2, 3, 4, 5), date(2024, 2, 29), doc({"a": [1, 2]}),
            docb({"b": 2, "a": 1}), UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"))


def edges(doc, docb):
    """Edge values (limits, empty strings, epoch), json wrapped as in `full`."""
    return (False, -32768, -2147483648, 2**63 - 1, -0.25, 0.1, Decimal("-0.001"), "",
            "abcde", b"", datetime(1970, 1, 1, tzinfo=UTC),
            datetime(1999, 12, 31, 23, 59, 59, 500000), date(1970, 1, 1), doc([]),
            docb({"nested": {"k": None}}), UUID(int=0))


FULL_BACK = (True, 12, 345, 6789012345, 1.5, 2.25, Decimal("12.500"), "hello world", "abc",
             b"\xde\xad\xbe\xef", datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
             datetime(2024, 1, 2, 3, 4, 5), date(2024, 2, 29), {"a": [1, 2]},
             {"a": 1, "b": 2}, UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"))
EDGES_BACK = (False, -32768, -2147483648, 2**63 - 1, -0.25, 0.1, Decimal("-0.001"), "",
              "abcde", b"", datetime(1970, 1, 1, tzinfo=UTC),
              datetime(1999, 12, 31, 23, 59, 59, 500000), date(1970, 1, 1), [],
              {"nested": {"k": None}}, UUID(int=0))
NULLS = (None,) * 16


# Array columns, for the drivers' array tests: the common element types, each
# row with NULL elements, an empty array, a NULL array, or text that the
# array literal must quote or escape.
ARRAY_COLUMNS = ["tags", "n", "f", "d", "b", "at"]
ARRAY_COLUMN_TYPES = "tags text[], n int8[], f float8[], d numeric(6,2)[], b bool[], at timestamptz[]"
AT = datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
QUOTING = ["a", "b c", '"q"', "", "NULL", None, "back\\slash", "{x,y}", "comma,here", " pad "]
ARRAY_ROWS = [
    (QUOTING, [1, None, -2**63, 2**63 - 1], [1.5, None, -0.25, float("inf")],
     [Decimal("1.5"), None, Decimal("-9999.99"), Decimal("0")], [True, None, False],
     [AT, None, EPOCH]),
    ([], [], [], [], [], []),
    (None, None, None, None, None, None),
    ([None], [None], [None], [None], [None], [None]),
]
# numeric(6,2)[] keeps two decimals for every element.
ARRAY_DECIMALS_BACK = [["1.50", None, "-9999.99", "0.00"], [], None, [None]]
