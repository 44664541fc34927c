package dev.sluice.jdbc;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Array;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Properties;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Array columns (text[], int4[], int8[]) of a table and a stream through
 * {@code conn.createArrayOf} and {@code setArray}, one row at a time and in an
 * {@code addBatch}/{@code executeBatch} batch, read back with
 * {@code rs.getArray(...).getArray()} and as text with {@code getString}.
 *
 * <p>prepareThreshold=0 keeps every execution an unnamed statement with text
 * results; prepareThreshold=-1 makes every statement a named server-prepared
 * one from the first execution, with binary results for the array types
 * pgjdbc can receive in binary.
 */
class ArraysTest extends ServerTest {
  private static final String COLUMNS = "tags text[], nums int4[], big int8[]";

  /** One row's arrays; a null array is SQL NULL. */
  record Row(String[] tags, Integer[] nums, Long[] big) {}

  static final List<Row> ROWS = List.of(
      new Row(new String[] {"a", "b c", "\"q\"", "", "NULL", null, "back\\slash", "{x,y}",
          "comma,here", " pad ", "ünï"},
          new Integer[] {1, null, Integer.MIN_VALUE, Integer.MAX_VALUE},
          new Long[] {Long.MIN_VALUE, null, Long.MAX_VALUE}),
      new Row(new String[0], new Integer[0], new Long[0]),
      new Row(null, null, null),
      new Row(new String[] {null}, new Integer[] {null}, new Long[] {null}));

  /** The text form of each row's arrays, as PostgreSQL prints them. */
  static final List<List<String>> ROWS_TEXT = List.of(
      List.of("{a,\"b c\",\"\\\"q\\\"\",\"\",\"NULL\",NULL,\"back\\\\slash\",\"{x,y}\","
              + "\"comma,here\",\" pad \",ünï}",
          "{1,NULL,-2147483648,2147483647}",
          "{-9223372036854775808,NULL,9223372036854775807}"),
      List.of("{}", "{}", "{}"),
      Arrays.asList(null, null, null),
      List.of("{NULL}", "{NULL}", "{NULL}"));

  private Connection connect(int prepareThreshold) throws SQLException {
    Properties props = new Properties();
    props.setProperty("prepareThreshold", Integer.toString(prepareThreshold));
    return server.connect(props);
  }

  /** Binds a row's arrays as parameters first..first+2 with createArrayOf/setArray. */
  private static void bind(Connection conn, PreparedStatement ps, int first, Row r)
      throws SQLException {
    if (r.tags() == null) {
      ps.setNull(first, Types.ARRAY);
    } else {
      ps.setArray(first, conn.createArrayOf("text", r.tags()));
    }
    if (r.nums() == null) {
      ps.setNull(first + 1, Types.ARRAY);
    } else {
      ps.setArray(first + 1, conn.createArrayOf("int4", r.nums()));
    }
    if (r.big() == null) {
      ps.setNull(first + 2, Types.ARRAY);
    } else {
      ps.setArray(first + 2, conn.createArrayOf("int8", r.big()));
    }
  }

  private static Object[] elements(ResultSet rs, String column) throws SQLException {
    Array array = rs.getArray(column);
    return array == null ? null : (Object[]) array.getArray();
  }

  /** Reads key, tags, nums, big in key order and checks every row. */
  private static void assertRows(Connection conn, String select, List<Long> keys, List<Row> want,
      String which) throws SQLException {
    // Twice, so that the second run reuses a server-prepared statement.
    for (int run = 1; run <= 2; run++) {
      String what = which + " run " + run;
      List<Long> gotKeys = new ArrayList<>();
      try (PreparedStatement ps = conn.prepareStatement(select);
          ResultSet rs = ps.executeQuery()) {
        assertEquals("_text", rs.getMetaData().getColumnTypeName(2), what);
        assertEquals(Types.ARRAY, rs.getMetaData().getColumnType(2), what);
        assertEquals("_int4", rs.getMetaData().getColumnTypeName(3), what);
        assertEquals("_int8", rs.getMetaData().getColumnTypeName(4), what);
        int i = 0;
        while (rs.next()) {
          gotKeys.add(rs.getLong(1));
          assertTrue(i < want.size(), what + ": more rows than " + want.size());
          Row w = want.get(i);
          String row = what + " row " + i;
          Object[] tags = elements(rs, "tags");
          assertArrayEquals(w.tags(), tags, row + " tags");
          if (tags != null) {
            assertEquals(String[].class, tags.getClass(), row + " tags element class");
          }
          Object[] nums = elements(rs, "nums");
          assertArrayEquals(w.nums(), nums, row + " nums");
          if (nums != null) {
            assertEquals(Integer[].class, nums.getClass(), row + " nums element class");
          }
          Object[] big = elements(rs, "big");
          assertArrayEquals(w.big(), big, row + " big");
          if (big != null) {
            assertEquals(Long[].class, big.getClass(), row + " big element class");
          }
          i++;
        }
        assertEquals(want.size(), i, what + " row count");
      }
      assertEquals(keys, gotKeys, what + " keys");
    }
  }

  /** The arrays' text form (getString), in key order. */
  private static List<List<String>> texts(Connection conn, String select) throws SQLException {
    List<List<String>> out = new ArrayList<>();
    try (PreparedStatement ps = conn.prepareStatement(select); ResultSet rs = ps.executeQuery()) {
      while (rs.next()) {
        out.add(Arrays.asList(rs.getString("tags"), rs.getString("nums"),
            rs.getString("big")));
      }
    }
    return out;
  }

  @ParameterizedTest(name = "prepareThreshold={0}")
  @ValueSource(ints = {0, -1})
  void setArrayRoundTrips(int prepareThreshold) throws Exception {
    String suffix = prepareThreshold < 0 ? "named" : "unnamed";
    String table = "arr_t_" + suffix;
    String stream = "arr_s_" + suffix;
    try (Connection conn = connect(prepareThreshold)) {
      execute(conn, "CREATE TABLE " + table + " (id int8 PRIMARY KEY, " + COLUMNS + ")");
      execute(conn, "CREATE STREAM " + stream + " (" + COLUMNS + ")");
      try (PreparedStatement intoTable = conn.prepareStatement(
              "INSERT INTO " + table + " (id, tags, nums, big) VALUES (?, ?, ?, ?)");
          PreparedStatement intoStream = conn.prepareStatement(
              "INSERT INTO " + stream + " (tags, nums, big) VALUES (?, ?, ?)")) {
        for (int i = 0; i < ROWS.size(); i++) {
          intoTable.setLong(1, i + 1);
          bind(conn, intoTable, 2, ROWS.get(i));
          assertEquals(1, intoTable.executeUpdate(), "table row " + i);
          bind(conn, intoStream, 1, ROWS.get(i));
          assertEquals(1, intoStream.executeUpdate(), "stream row " + i);
        }
      }
      assertRows(conn, "SELECT id, tags, nums, big FROM " + table + " ORDER BY id",
          List.of(1L, 2L, 3L, 4L), ROWS, "table");
      assertRows(conn, "SELECT offset, tags, nums, big FROM " + stream + " ORDER BY offset",
          List.of(0L, 1L, 2L, 3L), ROWS, "stream");
      if (prepareThreshold == 0) {
        // Text results: getString is the server's text form. (With binary
        // results pgjdbc renders the array itself, quoting every element.)
        assertEquals(ROWS_TEXT,
            texts(conn, "SELECT tags, nums, big FROM " + table + " ORDER BY id"));
        assertEquals(ROWS_TEXT,
            texts(conn, "SELECT tags, nums, big FROM " + stream + " ORDER BY offset"));
      }

      // UPDATE ... SET with arrays, and an array in the WHERE clause.
      try (PreparedStatement ps = conn.prepareStatement(
          "UPDATE " + table + " SET tags = ?, nums = ? WHERE id = ?")) {
        ps.setArray(1, conn.createArrayOf("text", new String[] {"new", null}));
        ps.setArray(2, conn.createArrayOf("int4", new Integer[] {7}));
        ps.setLong(3, 3);
        assertEquals(1, ps.executeUpdate());
      }
      try (PreparedStatement ps = conn.prepareStatement(
          "SELECT id FROM " + table + " WHERE tags = ?")) {
        ps.setArray(1, conn.createArrayOf("text", new String[] {"new", null}));
        try (ResultSet rs = ps.executeQuery()) {
          assertTrue(rs.next());
          assertEquals(3L, rs.getLong(1));
          assertFalse(rs.next());
        }
      }
      List<Row> updated = new ArrayList<>(ROWS);
      updated.set(2, new Row(new String[] {"new", null}, new Integer[] {7}, null));
      assertRows(conn, "SELECT id, tags, nums, big FROM " + table + " ORDER BY id",
          List.of(1L, 2L, 3L, 4L), updated, "table after UPDATE");
    }
  }

  @ParameterizedTest(name = "prepareThreshold={0}")
  @ValueSource(ints = {0, -1})
  void setArrayInBatches(int prepareThreshold) throws Exception {
    String suffix = prepareThreshold < 0 ? "named" : "unnamed";
    String table = "arr_bt_" + suffix;
    String stream = "arr_bs_" + suffix;
    try (Connection conn = connect(prepareThreshold)) {
      execute(conn, "CREATE TABLE " + table + " (id int8 PRIMARY KEY, " + COLUMNS + ")");
      execute(conn, "CREATE STREAM " + stream + " (" + COLUMNS + ")");
      try (PreparedStatement intoTable = conn.prepareStatement(
              "INSERT INTO " + table + " (id, tags, nums, big) VALUES (?, ?, ?, ?)");
          PreparedStatement intoStream = conn.prepareStatement(
              "INSERT INTO " + stream + " (tags, nums, big) VALUES (?, ?, ?)")) {
        for (int i = 0; i < ROWS.size(); i++) {
          intoTable.setLong(1, i + 1);
          bind(conn, intoTable, 2, ROWS.get(i));
          intoTable.addBatch();
          bind(conn, intoStream, 1, ROWS.get(i));
          intoStream.addBatch();
        }
        assertArrayEquals(new int[] {1, 1, 1, 1}, intoTable.executeBatch());
        assertArrayEquals(new int[] {1, 1, 1, 1}, intoStream.executeBatch());
      }
      assertRows(conn, "SELECT id, tags, nums, big FROM " + table + " ORDER BY id",
          List.of(1L, 2L, 3L, 4L), ROWS, "table");
      assertRows(conn, "SELECT offset, tags, nums, big FROM " + stream + " ORDER BY offset",
          List.of(0L, 1L, 2L, 3L), ROWS, "stream");
    }
  }

  @ParameterizedTest(name = "prepareThreshold={0}")
  @ValueSource(ints = {0, -1})
  void javaArraysAsSetObject(int prepareThreshold) throws Exception {
    String stream = "arr_obj_" + (prepareThreshold < 0 ? "named" : "unnamed");
    try (Connection conn = connect(prepareThreshold)) {
      execute(conn, "CREATE STREAM " + stream + " (" + COLUMNS + ")");
      // pgjdbc sends String[] as text[], int[] as int4[] and long[] as int8[].
      try (PreparedStatement ps = conn.prepareStatement(
          "INSERT INTO " + stream + " (tags, nums, big) VALUES (?, ?, ?)")) {
        ps.setObject(1, new String[] {"x y", null, ""});
        ps.setObject(2, new int[] {3, -4});
        ps.setObject(3, new long[] {Long.MAX_VALUE});
        assertEquals(1, ps.executeUpdate());
      }
      try (PreparedStatement ps = conn.prepareStatement("SELECT tags, nums, big FROM " + stream);
          ResultSet rs = ps.executeQuery()) {
        assertTrue(rs.next());
        assertArrayEquals(new String[] {"x y", null, ""}, elements(rs, "tags"));
        assertArrayEquals(new Integer[] {3, -4}, elements(rs, "nums"));
        assertArrayEquals(new Long[] {Long.MAX_VALUE}, elements(rs, "big"));
        assertEquals("{\"x y\",NULL,\"\"}", rs.getString("tags"));
        assertFalse(rs.next());
      }
      try (PreparedStatement ps = conn.prepareStatement(
          "SELECT tags FROM " + stream + " WHERE tags IS NULL")) {
        try (ResultSet rs = ps.executeQuery()) {
          assertFalse(rs.next());
        }
      }
      try (PreparedStatement ps = conn.prepareStatement("SELECT ?::int8[]")) {
        ps.setNull(1, Types.ARRAY);
        try (ResultSet rs = ps.executeQuery()) {
          assertTrue(rs.next());
          assertNull(rs.getArray(1));
        }
      }
    }
  }

  @Test
  void databaseMetaDataReportsArrayColumns() throws Exception {
    try (Connection conn = connect()) {
      execute(conn, "CREATE TABLE arr_meta (id int PRIMARY KEY, " + COLUMNS
          + ", prices numeric(6,2)[])");
      List<String> got = new ArrayList<>();
      try (ResultSet rs = conn.getMetaData().getColumns(null, "public", "arr_meta", "%")) {
        while (rs.next()) {
          got.add(rs.getString("COLUMN_NAME") + ":" + rs.getString("TYPE_NAME") + ":"
              + rs.getInt("DATA_TYPE"));
        }
      }
      assertEquals(List.of("id:int4:" + Types.INTEGER, "tags:_text:" + Types.ARRAY,
          "nums:_int4:" + Types.ARRAY, "big:_int8:" + Types.ARRAY,
          "prices:_numeric:" + Types.ARRAY), got);
    }
  }
}
