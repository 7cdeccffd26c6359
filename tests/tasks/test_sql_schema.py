"""Spider schema text to SQLite, and the literals of a query (hand-checked)."""

from __future__ import annotations

import sqlite3

import pytest

from jaxrl_mt.tasks.sql_fuzz import column_pairs, order_columns
from jaxrl_mt.tasks.sql_schema import (
    Literal,
    SchemaError,
    has_top_level,
    parse_schema,
    split_statements,
    sql_literals,
    sqlite_ddl,
)

SPIDERISH = """
CREATE TABLE sqlite_sequence (
    name,
    seq
);
CREATE TABLE countrylanguage (
    CountryCode char(3) NOT NULL DEFAULT '' PRIMARY KEY,
    Language char(30) NOT NULL DEFAULT '' PRIMARY KEY,
    Percentage float(4,1) NOT NULL DEFAULT '0.0',
    PRIMARY KEY (CountryCode, Language),
    UNIQUE (CountryCode, Language),
    FOREIGN KEY (CountryCode) REFERENCES country(Code)
);
CREATE TABLE country (
    Code char(3) NOT NULL DEFAULT '' PRIMARY KEY,
    18_49_Rating_Share TEXT,
    Official_ratings_(millions) REAL,
    Owner INTEGER REFERENCES person(id),
    UNIQUE (Code)
);
"""


def test_spider_schema_becomes_valid_sqlite():
    with pytest.raises(sqlite3.OperationalError):  # as published, SQLite refuses it
        sqlite3.connect(":memory:").executescript(SPIDERISH)
    tables = parse_schema(SPIDERISH)
    assert [t.name for t in tables] == ["countrylanguage", "country"]  # sqlite_* skipped
    cl, co = tables
    assert cl.primary_key == ("CountryCode", "Language") and cl.uniques == (("CountryCode", "Language"),)
    assert cl.foreign_keys == ((("CountryCode",), "country", ("Code",)),)
    assert [(c.name, c.type, c.notnull, c.default) for c in cl.columns][2] == (
        "Percentage",
        "float(4,1)",
        True,
        "'0.0'",
    )
    assert [c.name for c in co.columns] == ["Code", "18_49_Rating_Share", "Official_ratings_(millions)", "Owner"]
    assert co.foreign_keys == ()  # 'person' is not in the schema
    conn = sqlite3.connect(":memory:")
    conn.executescript(sqlite_ddl(tables))
    conn.execute("INSERT INTO country VALUES ('ABC', 'x', 1.5, 3)")
    assert conn.execute('SELECT "Official_ratings_(millions)", "18_49_Rating_Share" FROM country').fetchall() == [
        (1.5, "x")
    ]
    conn.execute("INSERT INTO countrylanguage VALUES ('ABC', 'English', 10)")
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("INSERT INTO countrylanguage VALUES ('ABC', 'English', 20)")


def test_bad_schema_is_reported():
    with pytest.raises(SchemaError, match="no CREATE TABLE"):
        parse_schema("SELECT 1;")
    with pytest.raises(SchemaError, match="CREATE TABLE t: expected"):
        parse_schema("CREATE TABLE t AS SELECT 1;")


def test_literals_and_their_columns():
    names = {"country_code", "killed", "state", "continent", "population", "country", "age", "name"}
    sql = (
        "SELECT name FROM country WHERE country_code = 'USA' AND \"Asia\" = continent AND state NOT LIKE '%North%' "
        "AND age BETWEEN 18 AND 30 AND name IN ('a', 'b') GROUP BY name HAVING sum(T3.killed) > 10 "
        "AND population >= -2.5 ORDER BY age LIMIT 3"
    )
    assert sql_literals(sql, names) == [
        Literal("USA", "=", "country_code"),
        Literal("Asia", "=", "continent"),
        Literal("%North%", "LIKE", "state"),
        Literal(18, "BETWEEN", "age"),
        Literal(30, "BETWEEN", "age"),
        Literal("a", "IN", "name"),
        Literal("b", "IN", "name"),
        Literal(10, ">", "killed"),
        Literal(-2.5, ">=", "population"),
    ]  # LIMIT 3 is not a literal; "Asia" is a string because no column has that name
    assert sql_literals('SELECT "name" FROM t WHERE x < 5', names) == [Literal(5, "<", None)]


def test_clauses_statements_pairs_and_sort_columns():
    assert has_top_level("SELECT a FROM t ORDER BY a", "ORDER", "BY")
    assert not has_top_level("SELECT a FROM (SELECT a FROM t ORDER BY a LIMIT 2)", "ORDER", "BY")
    assert split_statements("SELECT ';'; -- note;\n SELECT 2 ;") == ["SELECT ';'", "-- note;\n SELECT 2"]
    names = {"id", "lost_in_battle", "killed"}
    assert column_pairs("SELECT 1 FROM a AS T1 JOIN b AS T2 ON T1.id = T2.lost_in_battle WHERE killed = 3", names) == [
        ("id", "lost_in_battle")
    ]
    assert order_columns("SELECT id FROM t ORDER BY killed DESC, id LIMIT 1", names) == ["killed", "id"]
