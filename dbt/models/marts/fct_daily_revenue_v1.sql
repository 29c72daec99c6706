-- v1: gross revenue, as revenue_hourly v1 means it, per UTC day of the order.
with

orders as (

    select * from {{ ref('fct_orders') }}

),

final as (

    select
        placed_date as revenue_date,
        currency,
        count(*) as orders,
        cast(sum(order_total) as decimal(18, 2)) as revenue

    from orders
    group by placed_date, currency

)

select * from final
