package dev.sluice.jdbc;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.BatchUpdateException;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Types;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * executeBatch with autocommit on: pgjdbc sends the whole batch between two
 * Syncs without BEGIN, which PostgreSQL runs as one implicit transaction. A
 * passing batch commits every statement; a failing one throws
 * BatchUpdateException and commits none of them, in every stream it touched.
 * (pgjdbc cannot batch a prepared statement holding two statements, so the
 * two-stream batches use Statement.addBatch.)
 */
class BatchTest extends ServerTest {
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

  /** The stream's rows as "offset:body", in offset order, read on another connection. */
  private List<String> rows(String stream) throws SQLException {
    List<String> out = new ArrayList<>();
    try (Statement st = reader.createStatement();
        ResultSet rs = st.executeQuery("SELECT offset, body FROM " + stream + " ORDER BY offset")) {
      while (rs.next()) {
        out.add(rs.getLong(1) + ":" + rs.getString(2));
      }
    }
    return out;
  }

  private static void createStreams(Connection conn, String... streams) throws SQLException {
    for (String stream : streams) {
      execute(conn, "CREATE STREAM " + stream + " (body text NOT NULL, n bigint)");
    }
  }

  private static long insertReturningOffset(Connection conn, String stream, String body)
      throws SQLException {
    try (PreparedStatement ps = conn.prepareStatement(
        "INSERT INTO " + stream + " (body, n) VALUES (?, 0) RETURNING offset")) {
      ps.setString(1, body);
      try (ResultSet rs = ps.executeQuery()) {
        assertTrue(rs.next());
        return rs.getLong(1);
      }
    }
  }

  @Test
  void statementBatchAppendsToBothStreams() throws Exception {
    try (Connection conn = connect()) {
      assertTrue(conn.getAutoCommit());
      createStreams(conn, "ok_a", "ok_b");
      try (Statement st = conn.createStatement()) {
        st.addBatch("INSERT INTO ok_a (body, n) VALUES ('a0', 0)");
        st.addBatch("INSERT INTO ok_b (body, n) VALUES ('b0', 1)");
        st.addBatch("INSERT INTO ok_a (body, n) VALUES ('a1', 2)");
        st.addBatch("INSERT INTO ok_b (body, n) VALUES ('b1', 3)");
        assertArrayEquals(new int[] {1, 1, 1, 1}, st.executeBatch());
      }
      assertEquals(List.of("0:a0", "1:a1"), rows("ok_a"));
      assertEquals(List.of("0:b0", "1:b1"), rows("ok_b"));
    }
  }

  @Test
  void failingStatementBatchAppendsToNeitherStream() throws Exception {
    try (Connection conn = connect()) {
      createStreams(conn, "failed_a", "failed_b");
      try (Statement st = conn.createStatement()) {
        st.addBatch("INSERT INTO failed_a (body, n) VALUES ('a0', 0)");
        st.addBatch("INSERT INTO failed_b (body, n) VALUES ('b0', 1)");
        assertArrayEquals(new int[] {1, 1}, st.executeBatch());

        st.addBatch("INSERT INTO failed_a (body, n) VALUES ('undone a', 10)");
        st.addBatch("INSERT INTO failed_b (body, n) VALUES ('undone b', 11)");
        st.addBatch("INSERT INTO failed_a (body, n) VALUES ('undone a again', 12)");
        st.addBatch("INSERT INTO failed_b (body, n) VALUES (NULL, 13)");
        st.addBatch("INSERT INTO failed_a (body, n) VALUES ('never run', 14)");
        BatchUpdateException e = assertThrows(BatchUpdateException.class, st::executeBatch);
        assertEquals("23502", e.getSQLState(), e.getMessage());
        // pgjdbc marks every statement since the last Sync as failed.
        assertArrayEquals(new int[] {Statement.EXECUTE_FAILED, Statement.EXECUTE_FAILED,
            Statement.EXECUTE_FAILED, Statement.EXECUTE_FAILED, Statement.EXECUTE_FAILED},
            e.getUpdateCounts());
      }
      assertEquals(List.of("0:a0"), rows("failed_a"), "stream A after the failing batch");
      assertEquals(List.of("0:b0"), rows("failed_b"), "stream B after the failing batch");

      // The connection is usable, outside any transaction, and offsets stay gapless.
      assertTrue(conn.getAutoCommit());
      assertEquals(1L, insertReturningOffset(conn, "failed_a", "after a"));
      assertEquals(1L, insertReturningOffset(conn, "failed_b", "after b"));
      assertEquals(List.of("0:a0", "1:after a"), rows("failed_a"));
      assertEquals(List.of("0:b0", "1:after b"), rows("failed_b"));
    }
  }

  @Test
  void preparedBatchIsAllOrNothing() throws Exception {
    try (Connection conn = connect()) {
      createStreams(conn, "prepared_batch");
      try (PreparedStatement ps = conn.prepareStatement(
          "INSERT INTO prepared_batch (body, n) VALUES (?, ?)")) {
        for (int i = 0; i < 3; i++) {
          ps.setString(1, "p" + i);
          ps.setLong(2, i);
          ps.addBatch();
        }
        assertArrayEquals(new int[] {1, 1, 1}, ps.executeBatch());

        for (int i = 3; i < 7; i++) {
          if (i == 5) {
            ps.setNull(1, Types.VARCHAR);
          } else {
            ps.setString(1, "undone " + i);
          }
          ps.setLong(2, i);
          ps.addBatch();
        }
        BatchUpdateException e = assertThrows(BatchUpdateException.class, ps::executeBatch);
        assertEquals("23502", e.getSQLState(), e.getMessage());
      }
      assertEquals(List.of("0:p0", "1:p1", "2:p2"), rows("prepared_batch"));
      assertEquals(3L, insertReturningOffset(conn, "prepared_batch", "after"));
    }
  }
}
