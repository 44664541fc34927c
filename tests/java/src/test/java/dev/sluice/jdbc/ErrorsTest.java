package dev.sluice.jdbc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/** SQLException.getSQLState() carries PostgreSQL's SQLSTATE; the connection stays usable. */
class ErrorsTest extends ServerTest {
  private Connection conn;

  @BeforeAll
  void createStream() throws Exception {
    conn = connect();
    execute(conn, "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note text)");
    execute(conn, "INSERT INTO orders (customer, amount) VALUES ('ann', 1.50)");
  }

  @AfterAll
  void closeConnection() throws Exception {
    if (conn != null) {
      conn.close();
    }
  }

  static Stream<Arguments> statements() {
    return Stream.of(
        Arguments.of("0A000", "UPDATE orders SET amount = 0"),
        Arguments.of("0A000", "DELETE FROM orders WHERE customer = 'ann'"),
        Arguments.of("42P01", "SELECT * FROM no_such_stream"),
        Arguments.of("42P01", "INSERT INTO no_such_stream VALUES (1)"),
        Arguments.of("42601", "SELEC 1"),
        Arguments.of("42601", "SELECT * FROM orders WHERE"),
        Arguments.of("42703", "SELECT no_such_column FROM orders"),
        Arguments.of("42P07", "CREATE STREAM orders (x integer)"));
  }

  @ParameterizedTest(name = "{0}: Statement {1}")
  @MethodSource("statements")
  void statementSqlState(String sqlState, String sql) throws Exception {
    SQLException e = assertThrows(SQLException.class, () -> {
      try (Statement st = conn.createStatement()) {
        st.execute(sql);
      }
    });
    assertEquals(sqlState, e.getSQLState(), sql + ": " + e.getMessage());
    if (sqlState.equals("0A000")) {
      assertTrue(e.getMessage().contains("append-only"), e.getMessage());
    }
    assertUnchanged();
  }

  static Stream<Arguments> prepared() {
    return Stream.of(
        Arguments.of("0A000", "UPDATE orders SET amount = ? WHERE customer = ?", new Object[] {1, "ann"}),
        Arguments.of("42P01", "SELECT * FROM no_such_stream WHERE x = ?", new Object[] {1}),
        Arguments.of("42601", "SELECT * FROM orders WHERE customer = ? ORDER", new Object[] {"ann"}),
        Arguments.of("23502", "INSERT INTO orders (customer, amount) VALUES (?, ?)", new Object[] {null, 1}),
        Arguments.of("22P02", "INSERT INTO orders (customer, amount) VALUES ('x', CAST(? AS numeric))",
            new Object[] {"abc"}));
  }

  @ParameterizedTest(name = "{0}: PreparedStatement {1}")
  @MethodSource("prepared")
  void preparedStatementSqlState(String sqlState, String sql, Object[] params) throws Exception {
    SQLException e = assertThrows(SQLException.class, () -> {
      try (PreparedStatement ps = conn.prepareStatement(sql)) {
        for (int i = 0; i < params.length; i++) {
          if (params[i] == null) {
            ps.setNull(i + 1, java.sql.Types.VARCHAR);
          } else {
            ps.setObject(i + 1, params[i]);
          }
        }
        ps.execute();
      }
    });
    assertEquals(sqlState, e.getSQLState(), sql + ": " + e.getMessage());
    assertUnchanged();
  }

  private void assertUnchanged() throws SQLException {
    try (Statement st = conn.createStatement();
        ResultSet rs = st.executeQuery("SELECT count(*), min(customer) FROM orders")) {
      assertTrue(rs.next());
      assertEquals(1, rs.getLong(1));
      assertEquals("ann", rs.getString(2));
    }
  }
}
