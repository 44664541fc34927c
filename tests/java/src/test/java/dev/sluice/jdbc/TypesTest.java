package dev.sluice.jdbc;

import static org.junit.jupiter.api.Assertions.assertAll;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.math.BigDecimal;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.Types;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;
import java.util.UUID;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import org.postgresql.util.PGobject;

/**
 * A PreparedStatement INSERT of every supported column type, read back with the
 * usual getters. pgjdbc types its parameters (setString as varchar, setInt as
 * int4, setObject(OffsetDateTime) as timestamptz, ...; Types.OTHER as 0).
 *
 * <p>prepareThreshold=0 keeps every execution an unnamed statement with text
 * results; prepareThreshold=-1 makes every statement a named server-prepared
 * one from the first execution, with binary results for the types pgjdbc can
 * receive in binary (ints, floats, bytea, date/time, uuid, ...).
 */
class TypesTest extends ServerTest {
  private static final List<String> COLUMNS = List.of("flag", "i2", "i4", "i8", "f4", "f8", "num",
      "txt", "vc", "bin", "tstz", "tsp", "day", "doc", "docb", "id");

  /** The values of one row, as Java objects; null is SQL NULL. */
  record Row(Boolean flag, Short i2, Integer i4, Long i8, Float f4, Double f8, BigDecimal num,
      String txt, String vc, byte[] bin, OffsetDateTime tstz, LocalDateTime tsp, LocalDate day,
      String doc, String docb, UUID id) {}

  static final Row FULL = new Row(true, (short) 12, 345, 6789012345L, 1.5f, 2.25,
      new BigDecimal("12.5"), "hello world", "abc", HexFormat.of().parseHex("deadbeef"),
      OffsetDateTime.of(2024, 1, 2, 3, 4, 5, 123456000, ZoneOffset.UTC),
      LocalDateTime.of(2024, 1, 2, 3, 4, 5, 123456000), LocalDate.of(2024, 2, 29),
      "{\"a\": [1, 2]}", "{\"b\": 2, \"a\": 1}",
      UUID.fromString("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"));
  static final Row FULL_BACK = new Row(true, (short) 12, 345, 6789012345L, 1.5f, 2.25,
      new BigDecimal("12.500"), "hello world", "abc", HexFormat.of().parseHex("deadbeef"),
      OffsetDateTime.of(2024, 1, 2, 3, 4, 5, 123456000, ZoneOffset.UTC),
      LocalDateTime.of(2024, 1, 2, 3, 4, 5, 123456000), LocalDate.of(2024, 2, 29),
      "{\"a\": [1, 2]}", "{\"a\": 1, \"b\": 2}",
      UUID.fromString("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"));
  static final Row EDGES = new Row(false, Short.MIN_VALUE, Integer.MIN_VALUE, Long.MAX_VALUE,
      -0.25f, 0.1, new BigDecimal("-0.001"), "", "abcde", new byte[0],
      OffsetDateTime.of(1970, 1, 1, 0, 0, 0, 0, ZoneOffset.ofHours(2)),
      LocalDateTime.of(1999, 12, 31, 23, 59, 59, 500000000), LocalDate.of(1970, 1, 1),
      "[]", "{\"nested\": {\"k\": null}}", new UUID(0, 0));
  static final Row EDGES_BACK = new Row(false, Short.MIN_VALUE, Integer.MIN_VALUE, Long.MAX_VALUE,
      -0.25f, 0.1, new BigDecimal("-0.001"), "", "abcde", new byte[0],
      OffsetDateTime.of(1969, 12, 31, 22, 0, 0, 0, ZoneOffset.UTC),
      LocalDateTime.of(1999, 12, 31, 23, 59, 59, 500000000), LocalDate.of(1970, 1, 1),
      "[]", "{\"nested\": {\"k\": null}}", new UUID(0, 0));
  static final Row NULLS = new Row(null, null, null, null, null, null, null, null, null, null,
      null, null, null, null, null, null);

  private static String ddl(String stream) {
    return "CREATE STREAM " + stream + " (flag boolean, i2 smallint, i4 integer, i8 bigint, "
        + "f4 real, f8 double precision, num numeric(10,3), txt text, vc varchar(5), bin bytea, "
        + "tstz timestamptz, tsp timestamp, day date, doc json, docb jsonb, id uuid)";
  }

  private static void bind(PreparedStatement ps, Row r) throws Exception {
    if (r.flag() == null) ps.setNull(1, Types.BOOLEAN); else ps.setBoolean(1, r.flag());
    if (r.i2() == null) ps.setNull(2, Types.SMALLINT); else ps.setShort(2, r.i2());
    if (r.i4() == null) ps.setNull(3, Types.INTEGER); else ps.setInt(3, r.i4());
    if (r.i8() == null) ps.setNull(4, Types.BIGINT); else ps.setLong(4, r.i8());
    if (r.f4() == null) ps.setNull(5, Types.REAL); else ps.setFloat(5, r.f4());
    if (r.f8() == null) ps.setNull(6, Types.DOUBLE); else ps.setDouble(6, r.f8());
    if (r.num() == null) ps.setNull(7, Types.NUMERIC); else ps.setBigDecimal(7, r.num());
    if (r.txt() == null) ps.setNull(8, Types.VARCHAR); else ps.setString(8, r.txt());
    if (r.vc() == null) ps.setNull(9, Types.VARCHAR); else ps.setString(9, r.vc());
    if (r.bin() == null) ps.setNull(10, Types.BINARY); else ps.setBytes(10, r.bin());
    if (r.tstz() == null) ps.setNull(11, Types.TIMESTAMP_WITH_TIMEZONE); else ps.setObject(11, r.tstz());
    if (r.tsp() == null) ps.setNull(12, Types.TIMESTAMP); else ps.setObject(12, r.tsp());
    if (r.day() == null) ps.setNull(13, Types.DATE); else ps.setObject(13, r.day());
    // json as a string of unspecified type (the usual idiom), jsonb as a PGobject.
    if (r.doc() == null) ps.setNull(14, Types.OTHER); else ps.setObject(14, r.doc(), Types.OTHER);
    if (r.docb() == null) {
      ps.setNull(15, Types.OTHER);
    } else {
      PGobject jsonb = new PGobject();
      jsonb.setType("jsonb");
      jsonb.setValue(r.docb());
      ps.setObject(15, jsonb);
    }
    if (r.id() == null) ps.setNull(16, Types.OTHER); else ps.setObject(16, r.id());
  }

  /** Reads each column with its usual getter; every column is checked, failures are collected. */
  private static void assertRow(ResultSet rs, Row want, String which) {
    List<Executable> checks = new ArrayList<>();
    checks.add(() -> assertEquals(want.flag(), rs.getObject("flag", Boolean.class), which + " flag"));
    checks.add(() -> assertEquals(want.i2(), rs.getObject("i2", Short.class), which + " i2"));
    checks.add(() -> assertEquals(want.i4(), rs.getObject("i4", Integer.class), which + " i4"));
    checks.add(() -> assertEquals(want.i8(), rs.getObject("i8", Long.class), which + " i8"));
    checks.add(() -> assertEquals(want.f4(), rs.getObject("f4", Float.class), which + " f4"));
    checks.add(() -> assertEquals(want.f8(), rs.getObject("f8", Double.class), which + " f8"));
    checks.add(() -> assertEquals(want.num(), rs.getBigDecimal("num"), which + " num"));
    checks.add(() -> assertEquals(want.txt(), rs.getString("txt"), which + " txt"));
    checks.add(() -> assertEquals(want.vc(), rs.getString("vc"), which + " vc"));
    checks.add(() -> assertArrayEquals(want.bin(), rs.getBytes("bin"), which + " bin"));
    checks.add(() -> {
      OffsetDateTime got = rs.getObject("tstz", OffsetDateTime.class);
      if (want.tstz() == null) {
        assertNull(got, which + " tstz");
      } else {
        assertEquals(want.tstz().toInstant(), got == null ? null : got.toInstant(), which + " tstz");
      }
    });
    checks.add(() -> assertEquals(want.tsp(), rs.getObject("tsp", LocalDateTime.class), which + " tsp"));
    checks.add(() -> assertEquals(want.day(), rs.getObject("day", LocalDate.class), which + " day"));
    checks.add(() -> assertEquals(want.doc(), rs.getString("doc"), which + " doc"));
    checks.add(() -> assertEquals(want.docb(), rs.getString("docb"), which + " docb"));
    checks.add(() -> {
      Object doc = rs.getObject("docb");
      if (want.docb() == null) {
        assertNull(doc, which + " docb object");
      } else {
        assertTrue(doc instanceof PGobject, which + " docb getObject() is a PGobject: " + doc);
        assertEquals("jsonb", ((PGobject) doc).getType(), which + " docb type");
      }
    });
    checks.add(() -> assertEquals(want.id(), rs.getObject("id", UUID.class), which + " id"));
    assertAll(which, checks.stream());
  }

  @ParameterizedTest(name = "prepareThreshold={0}")
  @ValueSource(ints = {0, -1})
  void everyTypeRoundTrips(int prepareThreshold) throws Exception {
    String stream = prepareThreshold < 0 ? "typed_named" : "typed_unnamed";
    Properties props = new Properties();
    props.setProperty("prepareThreshold", Integer.toString(prepareThreshold));
    try (Connection conn = server.connect(props)) {
      execute(conn, ddl(stream));
      String insert = "INSERT INTO " + stream + " (" + String.join(", ", COLUMNS) + ") VALUES ("
          + String.join(", ", COLUMNS.stream().map(c -> "?").toList()) + ")";
      try (PreparedStatement ps = conn.prepareStatement(insert)) {
        for (Row r : List.of(FULL, NULLS, EDGES)) {
          bind(ps, r);
          assertEquals(1, ps.executeUpdate());
        }
      }
      String select = "SELECT " + String.join(", ", COLUMNS) + " FROM " + stream + " ORDER BY offset";
      // Twice, so the second run reuses the prepared statement.
      for (int run = 1; run <= 2; run++) {
        try (PreparedStatement ps = conn.prepareStatement(select); ResultSet rs = ps.executeQuery()) {
          assertTrue(rs.next());
          assertRow(rs, FULL_BACK, "run " + run + " full row");
          assertTrue(rs.next());
          assertRow(rs, NULLS, "run " + run + " all-NULL row");
          for (String c : COLUMNS) {
            rs.getObject(c);
            assertTrue(rs.wasNull(), "run " + run + " NULL " + c);
          }
          assertTrue(rs.next());
          assertRow(rs, EDGES_BACK, "run " + run + " edge row");
          assertFalse(rs.next());
        }
      }
    }
  }

  @Test
  void selectStarReportsColumnTypes() throws Exception {
    try (Connection conn = connect()) {
      execute(conn, ddl("typed_meta"));
      try (PreparedStatement ps = conn.prepareStatement("SELECT * FROM typed_meta");
          ResultSet rs = ps.executeQuery()) {
        ResultSetMetaData md = rs.getMetaData();
        List<String> names = new ArrayList<>();
        List<String> typeNames = new ArrayList<>();
        List<Integer> sqlTypes = new ArrayList<>();
        for (int i = 1; i <= md.getColumnCount(); i++) {
          names.add(md.getColumnName(i));
          typeNames.add(md.getColumnTypeName(i));
          sqlTypes.add(md.getColumnType(i));
        }
        List<String> wantNames = new ArrayList<>(List.of("offset", "ts"));
        wantNames.addAll(COLUMNS);
        assertEquals(wantNames, names);
        assertEquals(List.of("int8", "timestamptz", "bool", "int2", "int4", "int8", "float4",
            "float8", "numeric", "text", "varchar", "bytea", "timestamptz", "timestamp", "date",
            "json", "jsonb", "uuid"), typeNames);
        assertEquals(List.of(Types.BIGINT, Types.TIMESTAMP, Types.BIT, Types.SMALLINT,
            Types.INTEGER, Types.BIGINT, Types.REAL, Types.DOUBLE, Types.NUMERIC, Types.VARCHAR,
            Types.VARCHAR, Types.BINARY, Types.TIMESTAMP, Types.TIMESTAMP, Types.DATE, Types.OTHER,
            Types.OTHER, Types.OTHER), sqlTypes);
      }
    }
  }
}
