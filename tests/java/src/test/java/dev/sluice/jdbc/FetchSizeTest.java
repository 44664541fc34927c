package dev.sluice.jdbc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * setFetchSize(2) with autocommit off: pgjdbc binds a named portal and reads it
 * with Execute(max_rows = 2), expecting PortalSuspended until the last batch.
 * Every query is finite: it has no lower bound on offset, or a LIMIT that the
 * committed rows satisfy.
 */
class FetchSizeTest extends ServerTest {
  private static final List<String> CUSTOMERS = List.of("ann", "bob", "cid", "dee", "eve", "fay", "gus");

  @BeforeAll
  void fill() throws Exception {
    try (Connection conn = connect()) {
      execute(conn, "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note text)");
      try (PreparedStatement ps = conn.prepareStatement(
          "INSERT INTO orders (customer, amount, note) VALUES (?, ?, ?)")) {
        for (int i = 0; i < CUSTOMERS.size(); i++) {
          ps.setString(1, CUSTOMERS.get(i));
          ps.setBigDecimal(2, new java.math.BigDecimal(i + ".25"));
          ps.setString(3, i % 2 == 0 ? "note " + i : null);
          ps.executeUpdate();
        }
      }
    }
  }

  private static List<String> readAll(ResultSet rs) throws SQLException {
    List<String> out = new ArrayList<>();
    while (rs.next()) {
      out.add(rs.getLong("offset") + ":" + rs.getString("customer"));
    }
    return out;
  }

  @Test
  void limitedSelectStarInBatchesOfTwo() throws Exception {
    try (Connection conn = connect()) {
      conn.setAutoCommit(false);
      try (Statement st = conn.createStatement()) {
        st.setFetchSize(2);
        try (ResultSet rs = st.executeQuery("SELECT * FROM orders WHERE offset >= 0 LIMIT 5")) {
          assertEquals(2, rs.getFetchSize());
          assertEquals(List.of("0:ann", "1:bob", "2:cid", "3:dee", "4:eve"), readAll(rs));
        }
      }
      conn.commit();
      assertStillUsable(conn);
    }
  }

  @Test
  void snapshotQueryWithParameterInBatchesOfTwo() throws Exception {
    try (Connection conn = connect()) {
      conn.setAutoCommit(false);
      try (PreparedStatement ps = conn.prepareStatement(
          "SELECT offset, customer FROM orders WHERE customer <> ? ORDER BY offset")) {
        ps.setFetchSize(2);
        ps.setString(1, "bob");
        try (ResultSet rs = ps.executeQuery()) {
          assertEquals(List.of("0:ann", "2:cid", "3:dee", "4:eve", "5:fay", "6:gus"), readAll(rs));
        }
        // Again: the statement is reused (a named statement after prepareThreshold runs).
        for (int run = 0; run < 5; run++) {
          ps.setString(1, "ann");
          try (ResultSet rs = ps.executeQuery()) {
            assertEquals(6, readAll(rs).size());
          }
        }
      }
      conn.commit();
      assertStillUsable(conn);
    }
  }

  @Test
  void resultSetClosedEarlyLeavesTheConnectionUsable() throws Exception {
    try (Connection conn = connect()) {
      conn.setAutoCommit(false);
      try (Statement st = conn.createStatement()) {
        st.setFetchSize(2);
        try (ResultSet rs = st.executeQuery(
            "SELECT offset, customer FROM orders WHERE offset >= 1 AND offset < 6 ORDER BY offset")) {
          assertTrue(rs.next());
          assertEquals("bob", rs.getString("customer"));
          assertTrue(rs.next());
          assertEquals("cid", rs.getString("customer"));
          assertTrue(rs.next(), "the third row needs a second Execute");
          assertEquals("dee", rs.getString("customer"));
        }
      }
      conn.commit();
      assertStillUsable(conn);
    }
  }

  private static void assertStillUsable(Connection conn) throws SQLException {
    try (Statement st = conn.createStatement();
        ResultSet rs = st.executeQuery("SELECT count(*) FROM orders")) {
      assertTrue(rs.next());
      assertEquals(CUSTOMERS.size(), rs.getLong(1));
      assertFalse(rs.next());
    }
    conn.commit();
  }
}
