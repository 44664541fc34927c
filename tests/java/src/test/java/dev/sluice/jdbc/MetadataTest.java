package dev.sluice.jdbc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.ResultSet;
import java.sql.Types;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * DatabaseMetaData, as BI tools (DBeaver, Metabase) use it to list tables and
 * columns: pgjdbc answers these from pg_catalog (pg_namespace, pg_class,
 * pg_attribute, pg_type, pg_description, pg_index, ...). A stream is a table in
 * schema public whose columns are offset and ts followed by the declared ones.
 */
class MetadataTest extends ServerTest {
  private Connection conn;

  @BeforeAll
  void createStream() throws Exception {
    conn = connect();
    execute(conn, "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note text)");
    execute(conn, "CREATE TABLE accounts (region text, id int, balance bigint, PRIMARY KEY (region, id))");
  }

  @AfterAll
  void closeConnection() throws Exception {
    if (conn != null) {
      conn.close();
    }
  }

  @Test
  void getTablesListsTheStream() throws Exception {
    DatabaseMetaData meta = conn.getMetaData();
    List<String> tables = new ArrayList<>();
    try (ResultSet rs = meta.getTables(null, "public", "%", new String[] {"TABLE"})) {
      while (rs.next()) {
        assertEquals("public", rs.getString("TABLE_SCHEM"));
        assertEquals("TABLE", rs.getString("TABLE_TYPE"));
        tables.add(rs.getString("TABLE_NAME"));
      }
    }
    assertTrue(tables.contains("orders"), "getTables: " + tables);
    try (ResultSet rs = meta.getTables(null, "public", "orders", null)) {
      assertTrue(rs.next(), "getTables(null, \"public\", \"orders\", null) finds the stream");
      assertEquals("orders", rs.getString("TABLE_NAME"));
      assertFalse(rs.next());
    }
  }

  @Test
  void getColumnsListsSystemAndDeclaredColumnsInOrder() throws Exception {
    DatabaseMetaData meta = conn.getMetaData();
    List<String> names = new ArrayList<>();
    List<String> typeNames = new ArrayList<>();
    List<Integer> dataTypes = new ArrayList<>();
    List<Integer> nullable = new ArrayList<>();
    List<String> isNullable = new ArrayList<>();
    List<Integer> positions = new ArrayList<>();
    int amountSize = -1;
    int amountDigits = -1;
    try (ResultSet rs = meta.getColumns(null, "public", "orders", "%")) {
      while (rs.next()) {
        assertEquals("public", rs.getString("TABLE_SCHEM"));
        assertEquals("orders", rs.getString("TABLE_NAME"));
        names.add(rs.getString("COLUMN_NAME"));
        typeNames.add(rs.getString("TYPE_NAME"));
        dataTypes.add(rs.getInt("DATA_TYPE"));
        nullable.add(rs.getInt("NULLABLE"));
        isNullable.add(rs.getString("IS_NULLABLE"));
        positions.add(rs.getInt("ORDINAL_POSITION"));
        if ("amount".equals(rs.getString("COLUMN_NAME"))) {
          amountSize = rs.getInt("COLUMN_SIZE");
          amountDigits = rs.getInt("DECIMAL_DIGITS");
        }
      }
    }
    assertEquals(List.of("offset", "ts", "customer", "amount", "note"), names);
    assertEquals(List.of("int8", "timestamptz", "text", "numeric", "text"), typeNames);
    assertEquals(List.of(Types.BIGINT, Types.TIMESTAMP, Types.VARCHAR, Types.NUMERIC, Types.VARCHAR),
        dataTypes);
    int no = DatabaseMetaData.columnNoNulls;
    int yes = DatabaseMetaData.columnNullable;
    assertEquals(List.of(no, no, no, yes, yes), nullable, "NULLABLE");
    assertEquals(List.of("NO", "NO", "NO", "YES", "YES"), isNullable, "IS_NULLABLE");
    assertEquals(List.of(1, 2, 3, 4, 5), positions, "ORDINAL_POSITION");
    assertEquals(12, amountSize, "COLUMN_SIZE of numeric(12,2)");
    assertEquals(2, amountDigits, "DECIMAL_DIGITS of numeric(12,2)");
  }

  @Test
  void getSchemasIncludesPublic() throws Exception {
    List<String> schemas = new ArrayList<>();
    try (ResultSet rs = conn.getMetaData().getSchemas()) {
      while (rs.next()) {
        schemas.add(rs.getString("TABLE_SCHEM"));
      }
    }
    assertTrue(schemas.contains("public"), "getSchemas: " + schemas);
  }

  @Test
  void getPrimaryKeysOfAStreamIsEmpty() throws Exception {
    try (ResultSet rs = conn.getMetaData().getPrimaryKeys(null, "public", "orders")) {
      assertFalse(rs.next(), "a stream has no primary key");
    }
  }

  @Test
  void getPrimaryKeysOfATable() throws Exception {
    List<String> keys = new ArrayList<>();
    try (ResultSet rs = conn.getMetaData().getPrimaryKeys(null, "public", "accounts")) {
      while (rs.next()) {
        assertEquals("accounts_pkey", rs.getString("PK_NAME"));
        keys.add(rs.getShort("KEY_SEQ") + ":" + rs.getString("COLUMN_NAME"));
      }
    }
    assertEquals(List.of("1:region", "2:id"), keys);
  }
}
