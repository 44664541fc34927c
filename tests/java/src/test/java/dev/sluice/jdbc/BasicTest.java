package dev.sluice.jdbc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.math.BigDecimal;
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.Statement;
import java.sql.Types;
import java.time.OffsetDateTime;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** Connecting with pgjdbc, CREATE STREAM, INSERT and SELECT. */
class BasicTest extends ServerTest {

  @Test
  void connects() throws Exception {
    try (Connection conn = connect()) {
      assertTrue(conn.isValid(5));
      DatabaseMetaData meta = conn.getMetaData();
      assertEquals("PostgreSQL", meta.getDatabaseProductName());
      assertTrue(meta.getDatabaseProductVersion().matches("\\d+\\.\\d+.*"),
          meta.getDatabaseProductVersion());
      assertTrue(meta.getDatabaseMajorVersion() >= 12, "server_version " + meta.getDatabaseProductVersion());
      try (Statement st = conn.createStatement(); ResultSet rs = st.executeQuery("SELECT 1")) {
        assertTrue(rs.next());
        assertEquals(1, rs.getInt(1));
        assertFalse(rs.next());
      }
      try (PreparedStatement ps = conn.prepareStatement("SELECT version()");
          ResultSet rs = ps.executeQuery()) {
        assertTrue(rs.next());
        assertTrue(rs.getString(1).startsWith("PostgreSQL "), rs.getString(1));
      }
    }
  }

  @Test
  void createStreamInsertAndSelectStar() throws Exception {
    try (Connection conn = connect()) {
      try (Statement st = conn.createStatement()) {
        assertEquals(0, st.executeUpdate(
            "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note text)"));
      }
      try (PreparedStatement ps = conn.prepareStatement(
          "INSERT INTO orders (customer, amount, note) VALUES (?, ?, ?)")) {
        ps.setString(1, "ann");
        ps.setBigDecimal(2, new BigDecimal("10.5"));
        ps.setNull(3, Types.VARCHAR);
        assertEquals(1, ps.executeUpdate());
        ps.setString(1, "bob");
        ps.setBigDecimal(2, new BigDecimal("3"));
        ps.setString(3, "second");
        assertEquals(1, ps.executeUpdate());
      }
      try (PreparedStatement ps = conn.prepareStatement(
          "INSERT INTO orders (customer) VALUES (?) RETURNING offset, ts")) {
        ps.setString(1, "cid");
        try (ResultSet rs = ps.executeQuery()) {
          assertTrue(rs.next());
          assertEquals(2L, rs.getLong("offset"));
          assertNotNull(rs.getObject("ts", OffsetDateTime.class));
          assertFalse(rs.next());
        }
      }
      try (Statement st = conn.createStatement();
          ResultSet rs = st.executeQuery("SELECT * FROM orders ORDER BY offset")) {
        ResultSetMetaData md = rs.getMetaData();
        List<String> names = new ArrayList<>();
        List<String> types = new ArrayList<>();
        for (int i = 1; i <= md.getColumnCount(); i++) {
          names.add(md.getColumnName(i));
          types.add(md.getColumnTypeName(i));
        }
        assertEquals(List.of("offset", "ts", "customer", "amount", "note"), names);
        assertEquals(List.of("int8", "timestamptz", "text", "numeric", "text"), types);

        OffsetDateTime previous = null;
        List<String> rows = new ArrayList<>();
        while (rs.next()) {
          rows.add(rs.getLong(1) + "|" + rs.getString(3) + "|" + rs.getBigDecimal(4) + "|"
              + rs.getString(5));
          OffsetDateTime ts = rs.getObject(2, OffsetDateTime.class);
          assertNotNull(ts);
          if (previous != null) {
            assertFalse(ts.isBefore(previous), "ts never decreases");
          }
          previous = ts;
        }
        assertEquals(List.of("0|ann|10.50|null", "1|bob|3.00|second", "2|cid|null|null"), rows);
      }
      try (PreparedStatement ps = conn.prepareStatement(
          "SELECT customer FROM orders WHERE amount > ? AND offset < ? ORDER BY offset")) {
        ps.setBigDecimal(1, new BigDecimal("1"));
        ps.setLong(2, 10);
        try (ResultSet rs = ps.executeQuery()) {
          assertTrue(rs.next());
          assertEquals("ann", rs.getString(1));
          assertTrue(rs.next());
          assertEquals("bob", rs.getString(1));
          assertFalse(rs.next());
        }
      }
      try (Statement st = conn.createStatement();
          ResultSet rs = st.executeQuery("SELECT note FROM orders WHERE offset = 0")) {
        assertTrue(rs.next());
        assertNull(rs.getString(1));
        assertTrue(rs.wasNull());
      }
    }
  }
}
