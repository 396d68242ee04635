"""The routing spec (spark_writer.routing.routes): what a Routes accepts, the schemas it routes, sink-writer's flags."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_writer.routing.routes import Routes, Unrouted, parse_route, routes_from_flags

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("region", pa.string()),
        pa.field("shard", pa.int32()),
        pa.field("target", pa.large_string()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("nested", pa.struct([pa.field("region", pa.string())])),
    ]
)


def test_static_routes_keep_their_order_and_tables_once() -> None:
    routes = Routes.static("region", [("eu", "shop.eu"), ("uk", "shop.eu"), ("us", "shop.us")])
    assert routes.tables == {"eu": "shop.eu", "uk": "shop.eu", "us": "shop.us"}
    assert routes.static_tables == ("shop.eu", "shop.us")
    assert routes.unrouted is Unrouted.DEFAULT and not routes.dynamic


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Routes.static("region", [("eu", "shop.eu"), ("eu", "shop.other")]), "route value 'eu' is given twice"),
        (lambda: Routes(" "), "the route column needs a name"),
        (lambda: Routes("region"), "routes nothing: give static routes"),
        (lambda: Routes("region", {"eu": "shop.eu"}, dynamic=True), "either static .* or dynamic"),
        (lambda: Routes("region", {"": "shop.eu"}), "the route to 'shop.eu' has an empty value"),
        (
            lambda: Routes("region", {"eu": "orders"}),
            r"route 'eu': table identifier 'orders' must be 'namespace\.table'",
        ),
        (lambda: Routes("region", {"eu": "shop.e\nu"}), "route 'eu': .* contains a control character"),
        (lambda: Routes("region", {"eu": "shop." + "t" * 256}), "the table name is 256 bytes long"),
        (lambda: Routes("region", {"eu": "shop.orders/eu"}), "route 'eu': .* the path separator '/'"),
    ],
)
def test_bad_routes_are_refused(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()  # type: ignore[operator]


def test_route_columns_that_routes_can_match() -> None:
    Routes.static("region", [("eu", "shop.eu")]).check_schema(SCHEMA)
    Routes.static("shard", [("7", "shop.seven"), ("-1", "shop.none")]).check_schema(SCHEMA)
    Routes("target", dynamic=True).check_schema(SCHEMA)


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        (Routes.static("country", [("eu", "shop.eu")]), "route column 'country' is not a top-level column of the data"),
        (Routes.static("shard", [("07", "shop.seven"), ("x", "shop.x")]), "the route values '07', 'x' can never match"),
        (Routes.static("ts", [("2025", "shop.y")]), "route column 'ts' is timestamp.* routes match string or integer"),
        (Routes.static("nested", [("eu", "shop.eu")]), "route column 'nested' is struct"),
        (Routes("shard", dynamic=True), "dynamic routes need a string route column: 'shard' is int32"),
    ],
)
def test_route_columns_that_cannot_route_are_refused(routes: Routes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        routes.check_schema(SCHEMA)


def test_route_flags() -> None:
    assert parse_route("a=b=shop.eq") == ("a=b", "shop.eq")
    assert routes_from_flags(None, (), False, None) is None
    assert routes_from_flags("region", ["eu=shop.eu", "us=shop.us"], False, None) == Routes(
        "region", {"eu": "shop.eu", "us": "shop.us"}
    )
    assert routes_from_flags("target", (), True, Unrouted.FAIL) == Routes(
        "target", dynamic=True, unrouted=Unrouted.FAIL
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ((None, ["eu=shop.eu"], False, None), "--route needs --route-by COLUMN"),
        ((None, (), True, Unrouted.FAIL), "--dynamic-routes and --unrouted need --route-by COLUMN"),
        (("region", (), False, None), "--route-by region needs --route VALUE=TABLE"),
        (("region", ["eu=shop.eu"], True, None), "--route and --dynamic-routes exclude each other"),
        (("region", ["eu"], False, None), "--route 'eu' is not VALUE=TABLE"),
        (("region", ["=shop.eu"], False, None), "--route '=shop.eu' is not VALUE=TABLE"),
        (("region", ["eu="], False, None), "--route 'eu=' is not VALUE=TABLE"),
    ],
)
def test_bad_flag_combinations_are_refused(flags: tuple[object, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        routes_from_flags(*flags)  # type: ignore[arg-type]
