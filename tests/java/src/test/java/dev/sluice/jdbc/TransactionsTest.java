package dev.sluice.jdbc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * setAutoCommit(false) with commit() and rollback(): pgjdbc sends BEGIN in the
 * same Sync as the transaction's first statement, then COMMIT or ROLLBACK.
 */
class TransactionsTest extends ServerTest {
  private Connection reader;

  @BeforeAll
  void openReader() throws Exception {
    reader = connect();
  }

  @AfterAll
  void closeReader() throws Exception {
    if (reader != null) {
      reader.close();
    }
  }

  private List<String> bodies(String stream) throws SQLException {
    List<String> out = new ArrayList<>();
    try (Statement st = reader.createStatement();
        ResultSet rs = st.executeQuery("SELECT body FROM " + stream + " ORDER BY offset")) {
      while (rs.next()) {
        out.add(rs.getString(1));
      }
    }
    return out;
  }

  private static void insert(Connection conn, String stream, String... bodies) throws SQLException {
    try (PreparedStatement ps = conn.prepareStatement("INSERT INTO " + stream + " VALUES (?)")) {
      for (String body : bodies) {
        ps.setString(1, body);
        assertEquals(1, ps.executeUpdate());
      }
    }
  }

  @Test
  void commitMakesRowsVisible() throws Exception {
    try (Connection writer = connect()) {
      execute(writer, "CREATE STREAM committed (body text)");
      writer.setAutoCommit(false);
      insert(writer, "committed", "a", "b", "c");
      assertEquals(List.of(), bodies("committed"), "uncommitted rows are invisible to other sessions");
      writer.commit();
      assertEquals(List.of("a", "b", "c"), bodies("committed"));
      insert(writer, "committed", "d");
      writer.commit();
      assertEquals(List.of("a", "b", "c", "d"), bodies("committed"));
      try (Statement st = reader.createStatement();
          ResultSet rs = st.executeQuery("SELECT offset FROM committed ORDER BY offset")) {
        for (long want = 0; want < 4; want++) {
          assertTrue(rs.next());
          assertEquals(want, rs.getLong(1));
        }
      }
    }
  }

  @Test
  void rollbackDiscardsRows() throws Exception {
    try (Connection writer = connect()) {
      execute(writer, "CREATE STREAM rolled (body text)");
      insert(writer, "rolled", "kept");
      writer.setAutoCommit(false);
      insert(writer, "rolled", "discarded 1", "discarded 2");
      writer.rollback();
      assertEquals(List.of("kept"), bodies("rolled"));
      writer.setAutoCommit(true);
      try (PreparedStatement ps = writer.prepareStatement(
          "INSERT INTO rolled VALUES (?) RETURNING offset")) {
        ps.setString(1, "after");
        try (ResultSet rs = ps.executeQuery()) {
          assertTrue(rs.next());
          assertEquals(1L, rs.getLong(1), "offsets stay gapless after a rollback");
        }
      }
      assertEquals(List.of("kept", "after"), bodies("rolled"));
    }
  }

  @Test
  void transactionReadsItsOwnRows() throws Exception {
    try (Connection writer = connect()) {
      execute(writer, "CREATE STREAM own_rows (body text)");
      writer.setAutoCommit(false);
      insert(writer, "own_rows", "x", "y");
      try (Statement st = writer.createStatement();
          ResultSet rs = st.executeQuery("SELECT count(*) FROM own_rows")) {
        assertTrue(rs.next());
        assertEquals(2, rs.getLong(1));
      } finally {
        writer.rollback();
      }
      assertEquals(List.of(), bodies("own_rows"));
    }
  }

  @Test
  void errorAbortsTransactionUntilRollback() throws Exception {
    try (Connection writer = connect()) {
      execute(writer, "CREATE STREAM aborted (body text)");
      writer.setAutoCommit(false);
      insert(writer, "aborted", "lost");
      SQLException missing = assertThrows(SQLException.class,
          () -> insert(writer, "nowhere", "x"));
      assertEquals("42P01", missing.getSQLState());
      SQLException aborted = assertThrows(SQLException.class,
          () -> insert(writer, "aborted", "ignored"));
      assertEquals("25P02", aborted.getSQLState(), aborted.getMessage());
      writer.rollback();
      insert(writer, "aborted", "fresh");
      writer.commit();
      assertEquals(List.of("fresh"), bodies("aborted"));
    }
  }

  @Test
  void isolationLevelCanBeSetAndRead() throws Exception {
    try (Connection conn = connect()) {
      conn.setTransactionIsolation(Connection.TRANSACTION_SERIALIZABLE);
      assertEquals(Connection.TRANSACTION_SERIALIZABLE, conn.getTransactionIsolation());
      conn.setAutoCommit(false);
      conn.setTransactionIsolation(Connection.TRANSACTION_REPEATABLE_READ);
      try (Statement st = conn.createStatement(); ResultSet rs = st.executeQuery("SELECT 1")) {
        assertTrue(rs.next());
      }
      conn.commit();
    }
  }
}
